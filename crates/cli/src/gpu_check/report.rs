//! The gpu-check report: each step's status, summary and figures, written as `report.json` and
//! `report.md` and printed as a table.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a step ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Pass,
    Fail,
    NotRun,
}

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::NotRun => "not run",
        }
    }
}

/// One step's result, as the step process writes it (`result.json`) and the report keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepResult {
    pub step: String,
    pub status: Status,
    /// One line: what was checked and what was seen, or why the step did not run.
    pub summary: String,
    /// The step's measurements, by name.
    #[serde(default)]
    pub figures: Map<String, Value>,
    /// The device the step ran on (`cpu`, `cuda:0`), when it ran.
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub seconds: f64,
    /// The step's log, relative to the report's directory.
    #[serde(default)]
    pub log: Option<String>,
}

impl StepResult {
    pub fn not_run(step: &str, why: &str) -> Self {
        Self {
            step: step.to_owned(),
            status: Status::NotRun,
            summary: format!("not run: {why}"),
            figures: Map::new(),
            device: None,
            seconds: 0.0,
            log: None,
        }
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub kiln_version: String,
    pub libtorch: String,
    /// The GPU checked (`cuda:0: NVIDIA H100 …`), or why there is none.
    pub gpu: String,
    pub cpu: String,
    pub created: String,
    pub steps: Vec<StepResult>,
}

impl Report {
    pub fn count(&self, status: Status) -> usize {
        self.steps.iter().filter(|s| s.status == status).count()
    }

    /// `report.json` and `report.md` in `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self)?;
        crate::gpu_check::write_new(&dir.join("report.json"), json.as_bytes())?;
        crate::gpu_check::write_new(&dir.join("report.md"), self.markdown().as_bytes())?;
        Ok(())
    }

    /// The report as Markdown: a header, the table, and every step's figures.
    pub fn markdown(&self) -> String {
        let mut md = format!(
            "# kiln gpu-check\n\n- kiln {}, libtorch {}\n- GPU: {}\n- CPU: {}\n- {}\n- {} passed, \
             {} failed, {} not run\n\n",
            self.kiln_version,
            self.libtorch,
            self.gpu,
            self.cpu,
            self.created,
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::NotRun)
        );
        md.push_str("| step | status | device | s | summary |\n|---|---|---|---:|---|\n");
        for s in &self.steps {
            md.push_str(&format!(
                "| {} | {} | {} | {:.1} | {} |\n",
                s.step,
                s.status.word(),
                s.device.as_deref().unwrap_or("-"),
                s.seconds,
                s.summary.replace('|', "\\|").replace('\n', " ")
            ));
        }
        for s in self.steps.iter().filter(|s| !s.figures.is_empty()) {
            md.push_str(&format!("\n## {}\n\n", s.step));
            for (k, v) in &s.figures {
                md.push_str(&format!("- {k}: {}\n", figure(v)));
            }
            if let Some(log) = &s.log {
                md.push_str(&format!("- log: `{log}`\n"));
            }
        }
        md
    }

    /// The summary table for the terminal.
    pub fn table(&self) -> String {
        let width = self.steps.iter().map(|s| s.step.len()).max().unwrap_or(4);
        let mut out = String::new();
        for s in &self.steps {
            out.push_str(&format!(
                "{:<width$}  {:<7}  {:<6}  {:>6.1}s  {}\n",
                s.step,
                s.status.word(),
                s.device.as_deref().unwrap_or("-"),
                s.seconds,
                s.summary
            ));
        }
        out.push_str(&format!(
            "{} passed, {} failed, {} not run\n",
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::NotRun)
        ));
        out
    }
}

/// A figure as text: numbers with at most 4 significant decimals, strings bare.
fn figure(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() => format!("{f:.4}"),
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        let mut pass = StepResult::not_run("doctor", "");
        pass.status = Status::Pass;
        pass.summary = "libtorch 2.11.0 | no GPU".to_owned();
        pass.figures
            .insert("ratio".to_owned(), Value::from(0.123456));
        pass.device = Some("cpu".to_owned());
        Report {
            kiln_version: "0.1.0".to_owned(),
            libtorch: "2.11.0".to_owned(),
            gpu: "none".to_owned(),
            cpu: "test".to_owned(),
            created: "now".to_owned(),
            steps: vec![pass, StepResult::not_run("cuda-graphs", "no CUDA device")],
        }
    }

    #[test]
    fn markdown_escapes_pipes_and_lists_figures() {
        let md = report().markdown();
        assert!(
            md.contains("| doctor | pass | cpu | 0.0 | libtorch 2.11.0 \\| no GPU |"),
            "{md}"
        );
        assert!(md.contains("| cuda-graphs | not run | - | 0.0 | not run: no CUDA device |"));
        assert!(md.contains("- ratio: 0.1235"), "{md}");
        assert!(md.contains("1 passed, 0 failed, 1 not run"));
    }

    #[test]
    fn results_round_trip_through_json() {
        let r = report();
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.steps, r.steps);
        assert!(serde_json::to_string(&r).unwrap().contains("\"not-run\""));
    }
}
