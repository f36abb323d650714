//! One target's run: seeds first, then mutations of the corpus, each input under
//! `catch_unwind` and timed, until a number of inputs or seconds; inputs that panic or take
//! over the hang limit are written to files named after the target, seed and input number.
//! A watchdog thread ends the process, saving the input, when one never returns or asks the
//! allocator for more than its limits.

use std::collections::HashSet;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::mutate::Mutator;
use crate::rng::{Rng, fnv1a};
use crate::{Harness, Outcome, Target, alloc};

/// How long a run lasts and where its findings go.
#[derive(Debug, Clone)]
pub struct Options {
    /// Stop after this many inputs (seeds included).
    pub inputs: Option<u64>,
    /// Stop after this long.
    pub seconds: Option<f64>,
    pub seed: u64,
    /// Where failing inputs are written.
    pub out_dir: PathBuf,
    /// An input slower than this is a hang.
    pub hang: Duration,
}

/// What went wrong on one input.
#[derive(Debug, Clone)]
pub struct Failure {
    /// `panic` or `hang`.
    pub kind: &'static str,
    /// The input's number in the run (0 is the first seed).
    pub input: u64,
    pub message: String,
    /// Where the input was written (the first few of each target are).
    pub file: Option<PathBuf>,
}

/// One target's run.
#[derive(Debug, Clone)]
pub struct Report {
    pub target: &'static str,
    pub inputs: u64,
    pub seconds: f64,
    pub panics: u64,
    pub hangs: u64,
    /// The slowest input's time.
    pub slowest: Duration,
    /// Bytes live at the peak and the largest single allocation (zero without the counting
    /// allocator).
    pub memory: alloc::Usage,
    /// Inputs in the corpus at the end, seeds included.
    pub corpus: usize,
    pub failures: Vec<Failure>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.panics == 0 && self.hangs == 0
    }
}

/// Failing inputs written per target; the rest are counted.
const SAVED_PER_TARGET: usize = 10;
/// The most inputs the corpus holds.
const CORPUS_CAP: usize = 1024;

/// The inputs mutations start from: the seeds, then each input whose outcome was new.
#[derive(Debug)]
pub struct Corpus {
    inputs: Vec<Vec<u8>>,
    seeds: usize,
    seen: HashSet<u64>,
}

impl Corpus {
    pub fn new(seeds: Vec<Vec<u8>>) -> Self {
        let seeds: Vec<Vec<u8>> = if seeds.is_empty() {
            vec![vec![]]
        } else {
            seeds
        };
        Self {
            seeds: seeds.len(),
            inputs: seeds,
            seen: HashSet::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.inputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty()
    }

    /// The input numbered `n`: a seed, then mutations of the corpus.
    pub fn next(&self, n: u64, mutator: &mut Mutator) -> Vec<u8> {
        match usize::try_from(n).ok().filter(|&n| n < self.seeds) {
            Some(seed) => self.inputs[seed].clone(),
            None => {
                let base = mutator.rng().below(self.inputs.len());
                mutator.mutate(&self.inputs[base], &self.inputs)
            }
        }
    }

    /// Keeps `input` when its outcome's signature is new (replacing a random non-seed input
    /// once full).
    pub fn observe(&mut self, input: &[u8], signature: u64, rng: &mut Rng) {
        if !self.seen.insert(signature) {
            return;
        }
        if self.inputs.len() < CORPUS_CAP {
            self.inputs.push(input.to_vec());
        } else if self.inputs.len() > self.seeds {
            let k = self.seeds + rng.below(self.inputs.len() - self.seeds);
            self.inputs[k] = input.to_vec();
        }
    }
}

/// An outcome's signature: `Ok`, or the error's text without what varies between inputs of
/// one kind (the scratch directory, numbers, quoted and backticked values).
pub fn signature(outcome: &Outcome, scratch: &str) -> u64 {
    let Err(message) = outcome else {
        return fnv1a(b"ok");
    };
    let message = message.replace(scratch, "");
    let mut shape = Vec::with_capacity(message.len().min(240));
    let mut quoted = None;
    for b in message.bytes().take(400) {
        match (quoted, b) {
            (Some(q), _) if b == q => quoted = None,
            (Some(_), _) => {}
            (None, b'`' | b'"') => {
                quoted = Some(b);
                shape.push(b);
            }
            (None, b'0'..=b'9') if shape.last() == Some(&b'#') => {}
            (None, b'0'..=b'9') => shape.push(b'#'),
            (None, _) => shape.push(b),
        }
    }
    fnv1a(&shape)
}

/// What the watchdog sees of the input running now.
#[derive(Debug, Default)]
struct Current {
    target: &'static str,
    seed: u64,
    input: u64,
    started: Option<Instant>,
    bytes: Vec<u8>,
    out_dir: PathBuf,
}

/// The watchdog: a thread that ends the process, writing the input out, when one runs past
/// `give_up` or the allocator refused one of its requests.
#[derive(Debug, Clone)]
pub struct Watchdog {
    current: Arc<Mutex<Current>>,
}

/// The exit code when the watchdog ends a run for an input that never returned.
pub const EXIT_HANG: i32 = 3;
/// The exit code when an input asked for more memory than the limits.
pub const EXIT_MEMORY: i32 = 4;

impl Watchdog {
    /// Starts the thread.
    pub fn start(give_up: Duration) -> Result<Self, String> {
        let dog = Watchdog {
            current: Arc::default(),
        };
        let watched = dog.clone();
        std::thread::Builder::new()
            .name("kiln-fuzz watchdog".to_owned())
            .spawn(move || watched.watch(give_up))
            .map_err(|e| format!("cannot start the watchdog thread: {e}"))?;
        Ok(dog)
    }

    fn watch(&self, give_up: Duration) {
        alloc::exempt_this_thread();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let current = match self.current.lock() {
                Ok(c) => c,
                Err(poisoned) => poisoned.into_inner(),
            };
            if let Some(size) = alloc::refused() {
                let why = format!("asked the allocator for {size} bytes, past the limits");
                end_run(&current, "memory", &why, EXIT_MEMORY);
            }
            if current.started.is_some_and(|t| t.elapsed() > give_up) {
                let why = format!("still running after {} s", give_up.as_secs_f64());
                end_run(&current, "hang", &why, EXIT_HANG);
            }
        }
    }

    fn begin(&self, target: &'static str, options: &Options, input: u64, bytes: &[u8]) {
        let mut current = lock(&self.current);
        current.target = target;
        current.seed = options.seed;
        current.input = input;
        current.bytes.clear();
        current.bytes.extend_from_slice(bytes);
        if current.out_dir != options.out_dir {
            current.out_dir.clone_from(&options.out_dir);
        }
        current.started = Some(Instant::now());
    }

    fn end(&self) {
        lock(&self.current).started = None;
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes the running input out, says why the run ends, and ends the process.
fn end_run(current: &Current, kind: &str, why: &str, code: i32) -> ! {
    let file = save(
        &current.out_dir,
        current.target,
        current.seed,
        current.input,
        kind,
        &current.bytes,
    );
    eprintln!(
        "kiln-fuzz: target {}, seed {}, input {}: {why}; the input is in {}",
        current.target,
        current.seed,
        current.input,
        file.map_or_else(|e| format!("no file ({e})"), |p| p.display().to_string())
    );
    std::process::exit(code);
}

/// Writes a failing input as `<dir>/<target>-seed<seed>-input<n>.<kind>`.
pub fn save(
    dir: &Path,
    target: &str,
    seed: u64,
    input: u64,
    kind: &str,
    bytes: &[u8],
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let path = dir.join(format!("{target}-seed{seed}-input{input}.{kind}"));
    std::fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The last panic's message and place, from the hook [`quiet_panics`] installs.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Replaces the panic hook with one that records the message instead of printing it: the run
/// reports panics itself.
pub fn quiet_panics() {
    panic::set_hook(Box::new(|info| {
        *lock(&LAST_PANIC) = Some(info.to_string());
    }));
}

/// Runs `harness` on `input`: its outcome, or the panic's message.
pub fn run_one(harness: &mut dyn Harness, input: &[u8]) -> Result<Outcome, String> {
    lock(&LAST_PANIC).take();
    panic::catch_unwind(AssertUnwindSafe(|| harness.run(input))).map_err(|payload| {
        lock(&LAST_PANIC).take().unwrap_or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned())
        })
    })
}

/// The generator of `target`'s run with `seed`.
fn rng_for(target: &Target, seed: u64) -> Rng {
    Rng::new(seed ^ fnv1a(target.name.as_bytes()))
}

/// The longest input mutations make: room to grow past the seeds, within reason.
fn max_len(seeds: &[Vec<u8>]) -> usize {
    let longest = seeds.iter().map(Vec::len).max().unwrap_or(0);
    (longest * 4).clamp(4096, 1 << 20)
}

/// A run in progress: the target's harness, its corpus and generators, the report so far.
struct Run<'a> {
    target: &'a Target,
    options: &'a Options,
    watchdog: &'a Watchdog,
    harness: Box<dyn Harness>,
    corpus: Corpus,
    mutator: Mutator,
    /// For the target's fixups, and for the corpus's replacements.
    fixup_rng: Rng,
    keep_rng: Rng,
    /// The scratch directory's path, left out of outcome signatures.
    scratch: String,
    report: Report,
}

impl Run<'_> {
    /// Makes, runs and judges input `n`.
    fn step(&mut self, n: u64) {
        let mut input = self.corpus.next(n, &mut self.mutator);
        if n >= self.corpus.seeds as u64
            && let Some(fix) = self.target.fixup
        {
            fix(&mut self.fixup_rng, &mut input);
        }
        self.watchdog
            .begin(self.target.name, self.options, n, &input);
        let began = Instant::now();
        let outcome = run_one(self.harness.as_mut(), &input);
        let took = began.elapsed();
        self.watchdog.end();
        let report = &mut self.report;
        report.inputs = n + 1;
        report.slowest = report.slowest.max(took);
        match outcome {
            Ok(outcome) => {
                let sig = signature(&outcome, &self.scratch);
                self.corpus.observe(&input, sig, &mut self.keep_rng);
            }
            Err(message) => {
                report.panics += 1;
                record(report, self.options, "panic", n, message, &input);
            }
        }
        if took > self.options.hang {
            report.hangs += 1;
            let message = format!("took {:.3} s", took.as_secs_f64());
            record(report, self.options, "hang", n, message, &input);
        }
    }
}

/// The directory the targets write their files in: `$TMPDIR` where it is set, else a RAM
/// file system where Linux has one (`/dev/shm`: the file-reading targets ran 1.4–3.5× faster
/// there than on the disk under `/tmp`), else the system's temporary directory.
fn scratch_dir() -> Result<tempfile::TempDir, String> {
    let shm = std::path::Path::new("/dev/shm");
    let made = match std::env::var_os("TMPDIR").is_none() && shm.is_dir() {
        true => tempfile::tempdir_in(shm).or_else(|_| tempfile::tempdir()),
        false => tempfile::tempdir(),
    };
    made.map_err(|e| format!("cannot make a scratch dir: {e}"))
}

/// Runs `target` as `options` say.
pub fn run(target: &Target, options: &Options, watchdog: &Watchdog) -> Result<Report, String> {
    let scratch = scratch_dir()?;
    let harness = (target.make)(scratch.path())
        .map_err(|e| format!("target {}: cannot set up: {e}", target.name))?;
    let corpus = Corpus::new(harness.seeds());
    let mut rng = rng_for(target, options.seed);
    let (fixup_rng, keep_rng) = (Rng::new(rng.next_u64()), Rng::new(rng.next_u64()));
    let longest = max_len(&corpus.inputs);
    let mut run = Run {
        target,
        options,
        watchdog,
        harness,
        corpus,
        mutator: Mutator::new(rng, target.grammar, target.dictionary, longest),
        fixup_rng,
        keep_rng,
        scratch: scratch.path().display().to_string(),
        report: Report {
            target: target.name,
            inputs: 0,
            seconds: 0.0,
            panics: 0,
            hangs: 0,
            slowest: Duration::ZERO,
            memory: alloc::usage(),
            corpus: 0,
            failures: vec![],
        },
    };
    alloc::reset_peak();
    let start = Instant::now();
    let deadline = options.seconds.map(Duration::from_secs_f64);
    let mut n = 0;
    while options.inputs.is_none_or(|max| n < max) && deadline.is_none_or(|d| start.elapsed() < d) {
        run.step(n);
        n += 1;
    }
    let mut report = run.report;
    report.seconds = start.elapsed().as_secs_f64();
    report.memory = alloc::usage();
    report.corpus = run.corpus.len();
    Ok(report)
}

/// Adds a failure to the report, writing its input for the first few.
fn record(
    report: &mut Report,
    options: &Options,
    kind: &'static str,
    input: u64,
    message: String,
    bytes: &[u8],
) {
    let file = (report.failures.len() < SAVED_PER_TARGET)
        .then(|| {
            save(
                &options.out_dir,
                report.target,
                options.seed,
                input,
                kind,
                bytes,
            )
        })
        .and_then(Result::ok);
    if report.failures.len() < SAVED_PER_TARGET {
        report.failures.push(Failure {
            kind,
            input,
            message,
            file,
        });
    }
}

/// What one input replayed did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    Answered(Outcome),
    Panicked(String),
}

/// Runs `target` once on the input in `file`.
pub fn replay(target: &Target, file: &Path) -> Result<Replayed, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let scratch = scratch_dir()?;
    let mut harness = (target.make)(scratch.path())?;
    Ok(match run_one(harness.as_mut(), &bytes) {
        Ok(outcome) => Replayed::Answered(outcome),
        Err(panic) => Replayed::Panicked(panic),
    })
}
