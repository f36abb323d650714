//! The benchmark report: each suite's comparisons (a kiln figure beside its baseline's), how
//! suites write them, and how `kiln-bench report` merges, checks and renders them as Markdown.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{Msg, num};

/// The report format's name and version, in `report.json`'s `schema`.
pub const SCHEMA: &str = "kiln-bench/1";

/// The group of batch-size sweep rows (plotted as lines rather than bars).
pub const SWEEP_GROUP: &str = "batch-size sweep";

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Better {
    /// Times, latencies, memory.
    Lower,
    /// Throughputs.
    Higher,
}

/// A row's unit and which way is better, for [`SuiteOutput::row`].
pub type Unit = (&'static str, Better);
pub const MS: Unit = ("ms", Better::Lower);
pub const MS_STEP: Unit = ("ms/step", Better::Lower);
pub const SECONDS: Unit = ("s", Better::Lower);
pub const MIB: Unit = ("MiB", Better::Lower);
pub const NATS: Unit = ("nats", Better::Lower);
pub const SAMPLES_S: Unit = ("samples/s", Better::Higher);
pub const PERCENT: Unit = ("%", Better::Higher);

/// How a goal bounds a ratio; written `<=` and `>=` in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GoalOp {
    /// `ratio <= value`.
    #[serde(rename = "<=")]
    AtMost,
    /// `ratio >= value`.
    #[serde(rename = ">=")]
    AtLeast,
}

/// `<=` or `>=`, as the report writes it.
impl std::fmt::Display for GoalOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::AtMost => "<=",
            Self::AtLeast => ">=",
        })
    }
}

/// A goal on a comparison's ratio (kiln / baseline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Goal {
    pub op: GoalOp,
    #[serde(deserialize_with = "nan_for_null")]
    pub value: f64,
}

impl Goal {
    /// Whether `ratio` meets the goal (never for a non-finite ratio).
    pub fn met_by(&self, ratio: f64) -> bool {
        ratio.is_finite()
            && match self.op {
                GoalOp::AtMost => ratio <= self.value,
                GoalOp::AtLeast => ratio >= self.value,
            }
    }
}

/// A number that JSON may hold as `null` (serde_json writes a non-finite float so): NaN then.
fn nan_for_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// One kiln figure beside its baseline's, measured in the same run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub suite: String,
    pub name: String,
    /// Rows of one table/plot (e.g. "step time", "batch-size sweep", "optimization").
    pub group: String,
    #[serde(deserialize_with = "nan_for_null")]
    pub kiln: f64,
    #[serde(deserialize_with = "nan_for_null")]
    pub baseline: f64,
    /// What the baseline is, e.g. "PyTorch eager fp32 (fused AdamW)".
    pub baseline_name: String,
    pub unit: String,
    pub better: Better,
    /// kiln / baseline.
    #[serde(deserialize_with = "nan_for_null")]
    pub ratio: f64,
    pub goal: Option<Goal>,
    pub meets_goal: Option<bool>,
    /// Anything else worth keeping: MFU, the step breakdown, the batch size, the raw runs.
    #[serde(default)]
    pub details: Value,
}

impl Comparison {
    /// A comparison without a goal; the ratio is `kiln / baseline`, `unit` says which way wins.
    pub fn new(
        suite: &str,
        group: &str,
        name: impl Into<String>,
        (unit, better): (&str, Better),
        (kiln, baseline): (f64, f64),
        baseline_name: impl Into<String>,
    ) -> Self {
        Self {
            suite: suite.to_owned(),
            name: name.into(),
            group: group.to_owned(),
            kiln,
            baseline,
            baseline_name: baseline_name.into(),
            unit: unit.to_owned(),
            better,
            ratio: kiln / baseline,
            goal: None,
            meets_goal: None,
            details: json!({}),
        }
    }

    /// Sets the goal `ratio <= value`.
    pub fn at_most(self, value: f64) -> Self {
        self.goal(GoalOp::AtMost, value)
    }

    /// Sets the goal `ratio >= value`.
    pub fn at_least(self, value: f64) -> Self {
        self.goal(GoalOp::AtLeast, value)
    }

    fn goal(mut self, op: GoalOp, value: f64) -> Self {
        let goal = Goal { op, value };
        self.meets_goal = Some(goal.met_by(self.ratio));
        self.goal = Some(goal);
        self
    }

    /// Adds (or replaces) one entry of `details`.
    pub fn detail(mut self, key: &str, value: Value) -> Self {
        if let Value::Object(map) = &mut self.details {
            map.insert(key.to_owned(), value);
        }
        self
    }

    /// Marks the row as failing its goal (if any) whatever its figures, saying `why`.
    pub fn fails_because(mut self, why: String) -> Self {
        if self.goal.is_some() {
            self.meets_goal = Some(false);
        }
        self.detail(FAILS_BECAUSE, json!(why))
    }

    /// One human line: figures, ratio, goal.
    pub fn line(&self) -> String {
        let goal = match (&self.goal, self.meets_goal) {
            (Some(g), Some(met)) => {
                let verdict = if met { "met" } else { "MISSED" };
                format!("  goal {} {}: {verdict}", g.op, g.value)
            }
            _ => String::new(),
        };
        let (name, kiln, baseline) = (&self.name, figure(self.kiln), figure(self.baseline));
        let (unit, ratio) = (&self.unit, self.ratio);
        format!("{name:<44} kiln {kiln:>10} vs {baseline:>10} {unit:<10} ratio {ratio:>6.2}×{goal}")
    }
}

/// A row a suite could not measure here, and why (e.g. TF32 without a CUDA GPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

/// The runs of kiln's side and of the baseline's, each run's JSON.
pub type SidesRuns<'a> = (&'a [Value], &'a [Value]);

/// What one suite binary writes to its `--out` file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuiteOutput {
    pub suite: String,
    /// One sentence: what was measured and against what.
    pub what: String,
    pub comparisons: Vec<Comparison>,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Measured machine limits, e.g. `{"fp32_gemm_gflops": 95.1}`.
    #[serde(default)]
    pub peaks: Value,
    /// The suite's own full results (per-run figures, settings).
    #[serde(default)]
    pub details: Value,
}

impl SuiteOutput {
    /// An empty output of `suite`.
    pub fn new(suite: &str, what: &str) -> Self {
        Self {
            suite: suite.to_owned(),
            what: what.to_owned(),
            comparisons: vec![],
            skipped: vec![],
            peaks: json!({}),
            details: json!({}),
        }
    }

    /// Records a row that cannot be measured here.
    pub fn skip(&mut self, name: &str, reason: &str) {
        eprintln!("{name:<44} skipped: {reason}");
        let (name, reason) = (name.to_owned(), reason.to_owned());
        self.skipped.push(Skipped { name, reason });
    }

    /// A comparison of this suite in `group` ([`Comparison::new`]).
    pub fn row(
        &self,
        group: &str,
        name: impl Into<String>,
        unit: Unit,
        figures: (f64, f64),
        baseline: impl Into<String>,
    ) -> Comparison {
        Comparison::new(&self.suite, group, name, unit, figures, baseline)
    }

    /// The sweep's rows at batch `b` (throughput, peak memory): medians of kiln's runs `k` and
    /// the baseline's `t`; `series` begins their names (e.g. `mlp fp32`).
    pub fn push_sweep(&mut self, series: &str, b: usize, (k, t): SidesRuns<'_>, baseline: &str) {
        let figures = [
            ("throughput", "samples_per_s", SAMPLES_S),
            ("peak memory", "peak_memory_mib", MIB),
        ];
        for (what, key, unit) in figures {
            let name = format!("{series} b={b} {what}");
            let medians = (crate::median_of(k, key), crate::median_of(t, key));
            let row = self.row(SWEEP_GROUP, name, unit, medians, baseline);
            let row = row.detail("batch_size", json!(b));
            self.push(match key {
                "peak_memory_mib" => row.detail("memory", k[0]["peak_memory_kind"].clone()),
                _ => row,
            });
        }
    }

    /// Adds a comparison and prints its line.
    pub fn push(&mut self, c: Comparison) {
        eprintln!("{}", c.line());
        self.comparisons.push(c);
    }

    /// Writes the suite's JSON to `path`, creating its directory.
    pub fn write(&self, path: &Path) -> crate::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).at(dir)?;
        }
        write_json(path, self)?;
        eprintln!("{}: wrote {}", self.suite, path.display());
        Ok(())
    }

    /// Reads a suite's JSON.
    pub fn read(path: &Path) -> crate::Result<Self> {
        read_json(path, "a suite report")
    }
}

/// Reads `path` as JSON of a `T`; `what` names a `T` in the error (e.g. "a suite report").
pub fn read_json<T: DeserializeOwned>(path: &Path, what: &str) -> crate::Result<T> {
    let text = std::fs::read_to_string(path).at(path)?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not {what}: {e}", path.display()))
}

/// Writes `value` to `path` as pretty JSON.
pub fn write_json(path: &Path, value: &impl Serialize) -> crate::Result<()> {
    let text = serde_json::to_string_pretty(value).msg()?;
    std::fs::write(path, text).at(path)
}

/// One suite's entry in `report.json` (its comparisons are in the report's list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteSummary {
    pub suite: String,
    pub what: String,
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    #[serde(default)]
    pub details: Value,
}

/// The machine a report was measured on: logical CPUs, `cpu` or `cuda`, the rest as written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Machine {
    pub description: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

/// `report.json` read back: what [`assemble`] wrote, typed (the plots draw from it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema: String,
    #[serde(default)]
    pub created: String,
    #[serde(default)]
    pub quick: bool,
    #[serde(default)]
    pub machine: Machine,
    /// Measured machine limits, e.g. `{"fp32_gemm_gflops": 95.1}`.
    #[serde(default)]
    pub peaks: Map<String, Value>,
    #[serde(default)]
    pub suites: Vec<SuiteSummary>,
    pub comparisons: Vec<Comparison>,
}

impl Report {
    /// The typed report of an assembled one.
    pub fn from_value(report: &Value) -> crate::Result<Self> {
        Self::deserialize(report).map_err(|e| format!("not a {SCHEMA} report: {e}"))
    }

    /// Reads `report.json`.
    pub fn read(path: &Path) -> crate::Result<Self> {
        read_json(path, &format!("a {SCHEMA} report"))
    }
}

/// The `details` key saying why a row fails its goal whatever its figures (`meets_goal` false).
pub const FAILS_BECAUSE: &str = "fails_because";

/// The suite whose rows say whether kiln and PyTorch learn the same thing.
pub const LEARNING_SUITE: &str = "learning";

/// Marks every `train` row of a model whose `learning` row missed as failing; returns how many.
pub fn apply_learning_check(suites: &mut [SuiteOutput]) -> usize {
    let mut diverged = std::collections::HashMap::new();
    let learning = suites.iter().filter(|s| s.suite == LEARNING_SUITE);
    for c in learning.flat_map(|s| &s.comparisons) {
        if let (Some(model), Some(false)) = (c.details["model"].as_str(), c.meets_goal) {
            let name = c.name.clone();
            diverged.entry(model.to_owned()).or_insert(name);
        }
    }
    let mut marked = 0;
    let train = suites.iter_mut().filter(|s| s.suite == "train");
    for c in train.flat_map(|s| &mut s.comparisons) {
        let first = c.name.split_whitespace().next().unwrap_or_default();
        if let Some(row) = diverged.get(first) {
            let why = format!(
                "kiln and PyTorch do not learn the same thing for the {first} (learning: {row} \
                 missed its tolerance), so the speed comparison is not like for like"
            );
            *c = c.clone().fails_because(why);
            marked += 1;
        }
    }
    marked
}

/// The whole report: `meta` (created, quick, machine) and the suites' outputs merged.
pub fn assemble(meta: Value, suites: &[SuiteOutput]) -> Value {
    let peaks: Map<String, Value> = suites
        .iter()
        .filter_map(|s| s.peaks.as_object())
        .flat_map(Clone::clone)
        .collect();
    let mut report = json!({
        "schema": SCHEMA,
        "suites": suites.iter().map(|s| json!({
            "suite": s.suite,
            "what": s.what,
            "skipped": s.skipped,
            "details": s.details,
        })).collect::<Vec<_>>(),
        "peaks": peaks,
        "comparisons": suites.iter().flat_map(|s| s.comparisons.iter()).collect::<Vec<_>>(),
    });
    if let (Value::Object(r), Value::Object(m)) = (&mut report, meta) {
        r.extend(m);
    }
    report
}

/// Checks `report.json`'s shape (never its speed) and the expected suites; lists every problem.
pub fn validate(report: &Value, expected_suites: &[&str]) -> crate::Result<()> {
    let mut problems = vec![];
    let schema = &report["schema"];
    if *schema != SCHEMA {
        problems.push(format!("`schema` is {schema}, expected \"{SCHEMA}\""));
    }
    for key in ["created", "machine", "peaks"] {
        if report.get(key).is_none() {
            problems.push(format!("`{key}` is missing"));
        }
    }
    if !report["quick"].is_boolean() {
        problems.push("`quick` is not a boolean".to_owned());
    }
    if !report["comparisons"].is_array() {
        problems.push("`comparisons` is not a list".to_owned());
    }
    let comparisons = list(&report["comparisons"]);
    for (i, c) in comparisons.iter().enumerate() {
        let at = format!("comparisons[{i}] ({})", c["name"]);
        problems.extend(comparison_problems(c).iter().map(|p| format!("{at}: {p}")));
    }
    for name in expected_suites {
        if !list(&report["suites"]).iter().any(|s| s["suite"] == *name) {
            problems.push(format!("suite `{name}` is missing"));
        } else if !comparisons.iter().any(|c| c["suite"] == *name) {
            problems.push(format!("suite `{name}` has no comparisons"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// What is wrong with one comparison of `report.json`, in the order [`validate`] lists it.
fn comparison_problems(c: &Value) -> Vec<String> {
    let mut problems = vec![];
    for key in ["suite", "name", "group", "unit", "baseline_name"] {
        if c[key].as_str().is_none_or(str::is_empty) {
            problems.push(format!("`{key}` is not a non-empty string"));
        }
    }
    let [kiln, baseline, ratio] = ["kiln", "baseline", "ratio"].map(|key| {
        let n = c[key].as_f64().filter(|v| v.is_finite());
        if n.is_none() {
            problems.push(format!("`{key}` is not a finite number"));
        }
        n
    });
    if let (Some(k), Some(b), Some(r)) = (kiln, baseline, ratio)
        && b != 0.0
        && (k / b - r).abs() > 1e-9 * r.abs().max(1.0)
    {
        problems.push(format!("`ratio` {r} is not kiln / baseline ({})", k / b));
    }
    if !matches!(c["better"].as_str(), Some("lower" | "higher")) {
        problems.push("`better` is not \"lower\" or \"higher\"".to_owned());
    }
    match (&c["goal"], &c["meets_goal"]) {
        (Value::Null, Value::Null) => {}
        (goal, Value::Bool(met)) => match Goal::deserialize(goal) {
            Ok(g) => {
                let overruled = !*met && c["details"][FAILS_BECAUSE].is_string();
                if ratio.is_some_and(|r| g.met_by(r) != *met) && !overruled {
                    problems.push("`meets_goal` contradicts the ratio".to_owned());
                }
            }
            Err(_) => problems.push("`goal` is not {op: <= or >=, value}".to_owned()),
        },
        _ => problems.push("`goal` and `meets_goal` must both be null or both be set".to_owned()),
    }
    problems
}

/// A figure with about four significant digits.
fn figure(v: f64) -> String {
    match v.abs() {
        a if !a.is_finite() => format!("{v}"),
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        a if a >= 0.1 => format!("{v:.3}"),
        _ => format!("{v:.3e}"),
    }
}

/// The items of a JSON list, none where `v` is no list.
pub fn list(v: &Value) -> &[Value] {
    v.as_array().map_or(&[], Vec::as_slice)
}

/// A string of the report, `?` where there is none.
fn text(v: &Value) -> String {
    v.as_str().unwrap_or("?").to_owned()
}

/// A string of the report as Markdown text: `|` escaped, line breaks as spaces.
fn md_cell(v: &Value) -> String {
    text(v).replace('|', "\\|").replace('\n', " ")
}

/// The head of a suite's table of comparisons.
const MD_HEAD: &str = "| comparison | kiln | baseline | unit | better | ratio | goal |\n\
                       | --- | ---: | ---: | --- | --- | ---: | --- |\n";

/// A comparison's row of its suite's table: figures, ratio, goal.
fn md_row(c: &Value) -> String {
    let goal = match (&c["goal"], &c["meets_goal"]) {
        (g, Value::Bool(met)) if g.is_object() => {
            let verdict = if *met { "✅ met" } else { "❌ missed" };
            format!("{} {} {verdict}", text(&g["op"]), g["value"])
        }
        _ => "—".to_owned(),
    };
    let (baseline, name) = (figure(num(&c["baseline"])), md_cell(&c["baseline_name"]));
    let cells = [
        md_cell(&c["name"]),
        figure(num(&c["kiln"])),
        format!("{baseline} ({name})"),
        md_cell(&c["unit"]),
        text(&c["better"]),
        format!("{:.2}×", num(&c["ratio"])),
        goal,
    ];
    format!("| {} |\n", cells.join(" | "))
}

/// The kinds of note under a suite's table: MFU, where a missed goal's time goes, forced fails.
const NOTES: [fn(&Value) -> Option<String>; 3] = [
    |c| {
        let mfu = 100.0 * c["details"]["mfu"].as_f64()?;
        let name = md_cell(&c["name"]);
        let peak = text(&c["details"]["peak"]);
        let note = format!("{name}: model FLOP utilization {mfu:.1}% of the measured {peak} peak");
        Some(note)
    },
    |c| {
        let breakdown = Some(&c["details"]["breakdown"]).filter(|b| b.is_object())?;
        (c["meets_goal"] == false).then(|| {
            let (name, text) = (md_cell(&c["name"]), breakdown_text(breakdown));
            format!("where the time goes in **{name}** (missed): {text}")
        })
    },
    |c| {
        let why = Some(&c["details"][FAILS_BECAUSE]).filter(|w| w.is_string())?;
        let (name, why) = (md_cell(&c["name"]), md_cell(why));
        Some(format!("**{name}** fails whatever its figures: {why}"))
    },
];

/// The report as Markdown: machine and peaks, then per suite a table, notes and skipped rows.
pub fn markdown(report: &Value) -> String {
    let machine = &report["machine"];
    let quick = if report["quick"] == true {
        " · **quick run (CI-sized; not for judging speed)**"
    } else {
        ""
    };
    let mut out = format!(
        "# kiln benchmark report\n\n{}{quick} · kiln {} · torch {}\n\nMachine: {}\n\n",
        text(&report["created"]),
        text(&machine["kiln_version"]),
        text(&machine["torch_version"]),
        md_cell(&machine["description"]),
    );
    if let Some(peaks) = report["peaks"].as_object().filter(|p| !p.is_empty()) {
        let limit = |(k, v): (&String, &Value)| format!(" {k} = {};", figure(num(v)));
        let peaks: String = peaks.iter().map(limit).collect();
        out += &format!("Measured limits:{peaks}\n\n");
    }
    out += "Ratios are kiln / baseline; the unit's \"better\" says which way wins \
            (for times below 1 is faster, for throughputs above 1 is faster).\n\n";
    for suite in list(&report["suites"]) {
        let name = text(&suite["suite"]);
        out += &format!("## {name}\n\n{}\n\n", md_cell(&suite["what"]));
        let comparisons = list(&report["comparisons"]).iter();
        let rows: Vec<&Value> = comparisons.filter(|c| c["suite"] == *name).collect();
        if !rows.is_empty() {
            out += MD_HEAD;
            rows.iter().for_each(|c| out += &md_row(c));
            out.push('\n');
        }
        for note in NOTES {
            for line in rows.iter().filter_map(|c| note(c)) {
                out += &format!("- {line}\n");
            }
        }
        for skipped in list(&suite["skipped"]) {
            let (name, reason) = (md_cell(&skipped["name"]), md_cell(&skipped["reason"]));
            out += &format!("- not measured here: {name} ({reason})\n");
        }
        out.push('\n');
    }
    out
}

/// A train step's phases, in the order they happen (the keys of a step breakdown).
const PHASES: [&str; 4] = ["data_wait_ms", "forward_ms", "backward_ms", "optimizer_ms"];

/// `kiln: forward 3.1 ms (40%), …; baseline: …` of `{"kiln": {"forward_ms": …}, …}`.
fn breakdown_text(b: &Value) -> String {
    let side = |v: &Value| {
        let Some(map) = v.as_object() else {
            return "not measured".to_owned();
        };
        let total: f64 = map.values().filter_map(Value::as_f64).sum();
        let mut keys: Vec<&String> = map.keys().collect();
        keys.sort_by_key(|k| PHASES.iter().position(|p| p == k).unwrap_or(PHASES.len()));
        keys.into_iter()
            .filter_map(|k| map[k].as_f64().map(|v| (k, v)))
            .map(|(k, v)| {
                let phase = k.trim_end_matches("_ms").replace('_', " ");
                format!("{phase} {v:.2} ms ({:.0}%)", 100.0 * v / total)
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (kiln, baseline) = (side(&b["kiln"]), side(&b["baseline"]));
    format!("kiln: {kiln}; baseline: {baseline}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite() -> SuiteOutput {
        let mut s = SuiteOutput::new("train", "train step against PyTorch");
        let step = |name, kb| s.row("step time", name, MS_STEP, kb, "PyTorch eager fp32");
        let breakdown = json!({"kiln": {"forward_ms": 4.0, "backward_ms": 6.0}, "baseline": null});
        let rows = [
            step("mlp fp32 step", (2.0, 4.0)).at_most(0.7),
            step("transformer fp32 step", (12.0, 10.0))
                .at_most(1.0)
                .detail("mfu", json!(0.5))
                .detail("peak", json!("fp32 GEMM"))
                .detail("breakdown", breakdown),
        ];
        rows.into_iter().for_each(|r| s.push(r));
        s.skip("tf32", "needs a CUDA GPU");
        s.peaks = json!({"fp32_gemm_gflops": 100.0});
        s
    }

    /// `suites` assembled on a made-up machine, as a quick run.
    fn report_of(suites: &[SuiteOutput]) -> Value {
        let meta = json!({"created": "2026-11-21T00:00:00Z", "quick": true, "machine": {
            "description": "2 CPUs", "kiln_version": "0.1.0", "torch_version": "2.11.0"}});
        assemble(meta, suites)
    }

    #[test]
    fn goals_follow_the_ratio_and_its_direction() {
        let c = suite().comparisons;
        assert_eq!(c[0].ratio, 0.5);
        assert_eq!(c[0].meets_goal, Some(true));
        assert_eq!(c[1].meets_goal, Some(false));
        let faster = Comparison::new("d", "g", "n", SAMPLES_S, (3.0, 1.0), "b").at_least(2.0);
        assert_eq!(faster.meets_goal, Some(true));
        let nan = Comparison::new("d", "g", "n", MS, (f64::NAN, 1.0), "b").at_most(1.0);
        assert_eq!(nan.meets_goal, Some(false));
    }

    fn learning(model: &str, difference: f64) -> SuiteOutput {
        let mut s = SuiteOutput::new(LEARNING_SUITE, "same learning");
        let name = format!("{model} fp32, 100 steps: largest per-step |Δloss|");
        let row = s.row("same learning", name, NATS, (difference, 1e-4), "tolerance");
        s.push(row.at_most(1.0).detail("model", json!(model)));
        s
    }

    #[test]
    fn diverged_learning_fails_that_models_train_rows_whatever_their_speed() {
        let mut suites = [suite(), learning("transformer", 0.3), learning("mlp", 0.0)];
        let name = "transformer fp32 b=8 throughput";
        let sweep = suites[0].row(SWEEP_GROUP, name, SAMPLES_S, (5.0, 4.0), "eager fp32");
        suites[0].push(sweep);
        assert_eq!(apply_learning_check(&mut suites), 2);
        let rows = &suites[0].comparisons;
        // mlp learned the same: its row keeps its verdict.
        assert_eq!(rows[0].meets_goal, Some(true));
        assert!(rows[0].details.get(FAILS_BECAUSE).is_none());
        // The transformer's row with a goal fails; the one without a goal gets the reason only.
        assert_eq!(rows[1].meets_goal, Some(false));
        let why = rows[1].details[FAILS_BECAUSE].as_str().unwrap();
        let reason = "for the transformer (learning: transformer fp32";
        assert!(why.contains(reason), "{why}");
        assert_eq!(rows[2].meets_goal, None);
        assert!(rows[2].details[FAILS_BECAUSE].is_string());
        // A row that meets its goal on speed but is marked failed passes the shape check, and
        // the Markdown says why.
        suites[0].comparisons[1].ratio = 0.5;
        suites[0].comparisons[1].kiln = 5.0;
        let r = report_of(&suites);
        validate(&r, &["train", LEARNING_SUITE]).unwrap();
        assert!(markdown(&r).contains("- **transformer fp32 step** fails whatever its figures"));
        // Without a learning suite nothing changes.
        assert_eq!(apply_learning_check(&mut [suite()]), 0);
    }

    #[test]
    fn an_assembled_report_passes_its_own_check_which_names_every_problem() {
        let mut r = report_of(&[suite()]);
        validate(&r, &["train"]).unwrap();
        assert_eq!(r["peaks"]["fp32_gemm_gflops"], 100.0);
        assert_eq!(r["comparisons"].as_array().unwrap().len(), 2);
        assert_eq!(r["suites"][0]["skipped"][0]["name"], "tf32");
        r["comparisons"][0]["ratio"] = json!(0.9);
        r["comparisons"][1]["unit"] = json!("");
        r["comparisons"][1]["meets_goal"] = json!(true);
        r["quick"] = json!("yes");
        let err = validate(&r, &["train", "serve"]).unwrap_err();
        for needle in [
            "comparisons[0] (\"mlp fp32 step\"): `ratio` 0.9 is not kiln / baseline",
            "comparisons[1] (\"transformer fp32 step\"): `unit`",
            "`meets_goal` contradicts the ratio",
            "`quick` is not a boolean",
            "suite `serve` is missing",
        ] {
            assert!(err.contains(needle), "{needle} not in:\n{err}");
        }
        let mut r = report_of(&[suite()]);
        r["comparisons"][0]["kiln"] = json!(null);
        let err = validate(&r, &[]).unwrap_err();
        assert!(err.contains("`kiln` is not a finite number"));
    }

    #[test]
    fn markdown_has_a_row_per_comparison_and_explains_misses() {
        let md = markdown(&report_of(&[suite()]));
        for needle in [
            "| mlp fp32 step | 2.000 | 4.000 (PyTorch eager fp32) | ms/step",
            "0.50× | <= 0.7 ✅ met",
            "1.20× | <= 1.0 ❌ missed",
            "model FLOP utilization 50.0% of the measured fp32 GEMM peak",
            "where the time goes in **transformer fp32 step** (missed): kiln: forward 4.00 ms \
             (40%), backward 6.00 ms (60%); baseline: not measured",
            "not measured here: tf32 (needs a CUDA GPU)",
            "quick run",
        ] {
            assert!(md.contains(needle), "{needle} not in:\n{md}");
        }
    }

    #[test]
    fn suite_outputs_round_trip_through_files() {
        let dir = std::env::temp_dir().join(format!("kiln-report-{}", std::process::id()));
        let path = dir.join("suites/train.json");
        suite().write(&path).unwrap();
        let back = SuiteOutput::read(&path).unwrap();
        assert_eq!(back.comparisons, suite().comparisons);
        assert_eq!(back.skipped, suite().skipped);
        std::fs::write(dir.join("bad.json"), "{}").unwrap();
        let err = SuiteOutput::read(&dir.join("bad.json")).unwrap_err();
        assert!(err.contains("bad.json is not a suite report"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_fixture_reads_typed_and_assembles_back_to_the_same_file() {
        // testdata/report/: a report as `kiln-bench report` writes it, and its suites' outputs.
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/report");
        let file: Value = read_json(&fixture.join("report.json"), "JSON").unwrap();
        let suites: Vec<SuiteOutput> = ["train", "learning"]
            .iter()
            .map(|s| SuiteOutput::read(&fixture.join(format!("suites/{s}.json"))).unwrap())
            .collect();
        let meta = json!({"created": file["created"], "quick": file["quick"],
                          "machine": file["machine"]});
        assert_eq!(assemble(meta, &suites), file);
        validate(&file, &["train", LEARNING_SUITE]).unwrap();

        let report = Report::read(&fixture.join("report.json")).unwrap();
        let op = |c: &Comparison| c.goal.as_ref().map(|g| g.op);
        let ops: Vec<Option<GoalOp>> = report.comparisons.iter().map(op).collect();
        use GoalOp::{AtLeast, AtMost};
        assert_eq!(ops, [Some(AtMost), Some(AtLeast), None, None, Some(AtMost)]);
        assert_eq!(report.machine.cpus, Some(2));
        assert_eq!(report.suites[0].skipped[0].name, "torch.compile rows");
        // Typed and written again, nothing is lost or renamed.
        assert_eq!(serde_json::to_value(&report).unwrap(), file);
        assert!(markdown(&file).contains("| mlp fp32 step | 2.000 | 4.000"));
    }

    #[test]
    fn goal_ops_keep_their_spelling_and_null_numbers_read_as_nan() {
        let goal: Goal = serde_json::from_value(json!({"op": ">=", "value": null})).unwrap();
        assert_eq!(goal.op, GoalOp::AtLeast);
        assert!(goal.value.is_nan() && !goal.met_by(1.0));
        let at_most = Comparison::new("d", "g", "n", MS, (1.0, 1.0), "b").at_most(1.0);
        assert_eq!(json!(at_most.goal), json!({"op": "<=", "value": 1.0}));
        assert!(serde_json::from_value::<Goal>(json!({"op": "<", "value": 1.0})).is_err());
    }
}
