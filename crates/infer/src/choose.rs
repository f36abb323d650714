//! `infer.engine = auto` with a model both engines can run: both are timed at every batch-size
//! bucket kiln will serve (host to host, as the server runs them), the faster one is picked per
//! bucket (a near tie goes to libtorch), and the answer is cached per (model, hardware) like
//! the automatic batch size.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kiln_device::measured::MeasuredCache;
use serde::{Deserialize, Serialize};

use crate::engine::{Runner, bucket};
use crate::onnx::OnnxEngine;
use crate::{Engine, InferError};

/// One of the two engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Libtorch,
    Onnxruntime,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        self.name("libtorch")
    }

    /// Its name, the libtorch side named `torch` (`compiled` for an exported program's
    /// compiled eval forward, which is what runs on that side for one).
    pub fn name(self, torch: &'static str) -> &'static str {
        match self {
            EngineKind::Libtorch => torch,
            EngineKind::Onnxruntime => "onnxruntime",
        }
    }
}

/// Median milliseconds per batch of each engine at one batch-size bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    pub batch: usize,
    pub libtorch_ms: f64,
    pub onnxruntime_ms: f64,
}

/// onnxruntime must be this much faster to be picked (a stable tie-break: no flapping between
/// runs over noise).
pub const TIE: f64 = 0.03;

/// The faster engine per bucket.
pub fn choose(timings: &[Timing]) -> BTreeMap<usize, EngineKind> {
    timings
        .iter()
        .map(|t| {
            let kind = if t.onnxruntime_ms < t.libtorch_ms * (1.0 - TIE) {
                EngineKind::Onnxruntime
            } else {
                EngineKind::Libtorch
            };
            (t.batch, kind)
        })
        .collect()
}

/// The buckets a server with batches of up to `max` uses: powers of two below it, and `max`.
pub fn buckets(max: usize) -> Vec<usize> {
    let mut out: Vec<usize> = (0..usize::BITS)
        .map(|p| 1usize << p)
        .take_while(|&b| b < max)
        .collect();
    out.push(max.max(1));
    out
}

/// "onnxruntime for batches of 1–8, libtorch for 16–64" (`torch` names the libtorch side).
pub fn describe(pick: &BTreeMap<usize, EngineKind>, torch: &'static str) -> String {
    let mut runs: Vec<(EngineKind, usize, usize)> = Vec::new();
    for (&b, &k) in pick {
        match runs.last_mut() {
            Some((kind, _, last)) if *kind == k => *last = b,
            _ => runs.push((k, b, b)),
        }
    }
    let parts: Vec<String> = runs
        .iter()
        .map(|&(k, first, last)| {
            if first == last {
                format!("{} for batches of {first}", k.name(torch))
            } else {
                format!("{} for batches of {first}–{last}", k.name(torch))
            }
        })
        .collect();
    parts.join(", ")
}

/// Times both engines at each bucket, alternating which goes first.
pub fn measure(
    torch: &mut dyn Runner,
    onnx: &mut dyn Runner,
    batches: &[usize],
) -> Result<Vec<Timing>, InferError> {
    let numel: usize = torch.sample_shape().iter().product();
    let mut timings = Vec::with_capacity(batches.len());
    for (i, &b) in batches.iter().enumerate() {
        let input: Vec<f32> = (0..b * numel)
            .map(|j| ((j * 7919 % 1000) as f32) / 500.0 - 1.0)
            .collect();
        let (libtorch_ms, onnxruntime_ms) = if i % 2 == 0 {
            let t = median_ms(torch, &input, b)?;
            (t, median_ms(onnx, &input, b)?)
        } else {
            let o = median_ms(onnx, &input, b)?;
            (median_ms(torch, &input, b)?, o)
        };
        timings.push(Timing {
            batch: b,
            libtorch_ms,
            onnxruntime_ms,
        });
    }
    Ok(timings)
}

/// 3 warm-up runs, then runs until 0.1 s has passed (5 to 20 of them); their median.
fn median_ms(runner: &mut dyn Runner, input: &[f32], n: usize) -> Result<f64, InferError> {
    for _ in 0..3 {
        runner.run(input, n)?;
    }
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < 5 || (times.len() < 20 && started.elapsed().as_secs_f64() < 0.1) {
        let t = Instant::now();
        runner.run(input, n)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// One cached answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CachedChoice {
    pub timings: Vec<Timing>,
    /// Unix seconds when it was measured.
    pub measured_at: u64,
}

/// Answers by (model, hardware, threads, versions) key, in `<dir>/engine-choice.json`.
pub type EngineChoiceCache = MeasuredCache<CachedChoice>;

/// Opens the engine-choice cache in `dir`.
pub fn open_cache(dir: &Path) -> EngineChoiceCache {
    MeasuredCache::open_file(dir, "engine-choice.json", "engine-choice cache")
}

/// The libtorch and ONNX engines over one model, each batch run by the engine picked for its
/// bucket. Both models stay in memory (about twice the weights).
#[derive(Debug)]
pub struct AutoEngine {
    torch: Engine,
    onnx: OnnxEngine,
    pick: BTreeMap<usize, EngineKind>,
    max_batch: usize,
    note: String,
}

impl AutoEngine {
    /// Measures both engines at every bucket up to the smaller of their batch limits (or takes
    /// the answer cached under `key` in `cache`) and picks per bucket.
    pub fn new(
        mut torch: Engine,
        mut onnx: OnnxEngine,
        key: &str,
        cache: Option<&Path>,
    ) -> Result<Self, InferError> {
        if torch.sample_shape() != onnx.sample_shape() {
            return Err(InferError::Model {
                model: onnx.description().to_owned(),
                message: format!(
                    "takes samples of shape {:?}, its checkpoint {:?}: they are not the same model",
                    onnx.sample_shape(),
                    torch.sample_shape()
                ),
            });
        }
        let max_batch = torch.max_batch().min(onnx.max_batch());
        let mut store = cache.map(open_cache);
        let (timings, how) = match store.as_ref().and_then(|c| c.get(key)) {
            Some(hit) => (
                hit.timings.clone(),
                format!(
                    "cached from {} UTC",
                    kiln_train::rundir::timestamp(hit.measured_at)
                ),
            ),
            None => {
                let timings = measure(&mut torch, &mut onnx, &buckets(max_batch))?;
                if let Some(store) = store.as_mut() {
                    let answer = CachedChoice {
                        timings: timings.clone(),
                        measured_at: now(),
                    };
                    if let Err(e) = store.store(key, answer) {
                        tracing::warn!("{e}");
                    }
                }
                (timings, "measured now".to_owned())
            }
        };
        let pick = choose(&timings);
        let cache = store.as_ref().map(|c| c.path());
        let note = note(&pick, &timings, &how, cache, torch.kind_name());
        Ok(Self {
            torch,
            onnx,
            pick,
            max_batch,
            note,
        })
    }

    /// What was chosen and why, for the report.
    pub fn note(&self) -> &str {
        &self.note
    }

    /// The engine per batch-size bucket.
    pub fn choice(&self) -> &BTreeMap<usize, EngineKind> {
        &self.pick
    }

    /// The engine that runs batches of `n`.
    pub fn engine_for(&self, n: usize) -> EngineKind {
        let b = bucket(n, self.max_batch);
        self.pick
            .range(b..)
            .next()
            .map_or(EngineKind::Libtorch, |(_, &k)| k)
    }
}

fn note(
    pick: &BTreeMap<usize, EngineKind>,
    timings: &[Timing],
    how: &str,
    cache: Option<&Path>,
    torch: &'static str,
) -> String {
    let figures: Vec<String> = timings
        .iter()
        .map(|t| {
            format!(
                "b={} {:.2} vs {:.2} ms",
                t.batch, t.onnxruntime_ms, t.libtorch_ms
            )
        })
        .collect();
    let cached = cache.map_or_else(String::new, |p| {
        format!(
            "; cached in {} (delete the entry to measure again)",
            p.display()
        )
    });
    format!(
        "engine auto: {} ({how}: onnxruntime vs {torch} per batch, {}; a pick needs onnxruntime \
         {:.0} % faster{cached})",
        describe(pick, torch),
        figures.join(", "),
        TIE * 100.0
    )
}

/// Unix seconds now (when an answer was measured).
pub(crate) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Runner for AutoEngine {
    fn run(&mut self, inputs: &[f32], n: usize) -> Result<(Vec<f32>, Vec<usize>), InferError> {
        if n > self.max_batch {
            return Err(InferError::Input(format!(
                "{n} samples in one batch; 1 to {} fit",
                self.max_batch
            )));
        }
        match self.engine_for(n) {
            EngineKind::Libtorch => self.torch.run(inputs, n),
            EngineKind::Onnxruntime => self.onnx.run(inputs, n),
        }
    }
    fn sample_shape(&self) -> &[usize] {
        self.torch.sample_shape()
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn description(&self) -> String {
        self.onnx.description().to_owned()
    }
    fn engine(&self) -> String {
        let torch = self.torch.kind_name();
        format!(
            "auto: {} ({})",
            describe(&self.pick, torch),
            self.onnx.status()
        )
    }
    fn cuda_graphs(&self) -> String {
        self.torch.graph_status().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(batch: usize, libtorch_ms: f64, onnxruntime_ms: f64) -> Timing {
        Timing {
            batch,
            libtorch_ms,
            onnxruntime_ms,
        }
    }

    #[test]
    fn each_bucket_gets_the_faster_engine_and_a_near_tie_goes_to_libtorch() {
        let pick = choose(&[
            t(1, 0.30, 0.20),
            t(2, 0.40, 0.35),
            t(4, 1.00, 0.98),
            t(8, 1.00, 1.20),
        ]);
        use EngineKind::*;
        assert_eq!(
            pick.into_iter().collect::<Vec<_>>(),
            [
                (1, Onnxruntime),
                (2, Onnxruntime),
                (4, Libtorch),
                (8, Libtorch)
            ]
        );
    }

    #[test]
    fn buckets_cover_every_batch_the_server_forms() {
        assert_eq!(buckets(64), [1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(buckets(48), [1, 2, 4, 8, 16, 32, 48]);
        assert_eq!(buckets(1), [1]);
        for n in 1..=48 {
            assert!(buckets(48).contains(&bucket(n, 48)), "{n}");
        }
    }

    #[test]
    fn the_choice_reads_as_ranges() {
        use EngineKind::*;
        let pick: BTreeMap<usize, EngineKind> = [
            (1, Onnxruntime),
            (2, Onnxruntime),
            (4, Libtorch),
            (8, Libtorch),
        ]
        .into();
        assert_eq!(
            describe(&pick, "libtorch"),
            "onnxruntime for batches of 1–2, libtorch for batches of 4–8"
        );
    }

    #[test]
    fn the_cache_round_trips_and_survives_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut cache = open_cache(dir.path());
        assert!(cache.get("k").is_none());
        let answer = CachedChoice {
            timings: vec![t(1, 0.3, 0.2), t(2, 0.5, 0.6)],
            measured_at: 7,
        };
        cache.store("k", answer.clone()).unwrap();
        assert_eq!(open_cache(dir.path()).get("k"), Some(&answer));
        std::fs::write(cache.path(), "{ not json").unwrap();
        let mut damaged = open_cache(dir.path());
        assert!(damaged.get("k").is_none());
        damaged.store("j", answer.clone()).unwrap();
        assert_eq!(open_cache(dir.path()).get("j"), Some(&answer));
    }
}
