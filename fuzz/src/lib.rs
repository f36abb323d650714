//! kiln's fuzz harness: a target per parser kiln owns, each fed real files kiln writes and
//! reads, mutated, and required to answer every input with `Ok` or `Err`: never a panic, never
//! a hang, never memory a header merely claims.
//!
//! Stable Rust has no coverage instrumentation (libFuzzer and AFL need nightly or their own
//! toolchains), so the harness is its own mutation fuzzer, guided by outcomes instead of
//! coverage: an input whose error message (numbers and quoted values aside) was not seen before
//! joins the corpus, so inputs that pass one check and fail a deeper one are mutated further.
//! Everything is seeded: a run is reproducible from its target, seed and input number.
//!
//! - `targets`: the targets, one module each (their seeds, written by kiln's own writers or
//!   taken from the repository, and the parser calls).
//! - `mutate`, `rng`: the mutations (bytes, text, JSON trees) and the seeded generator.
//! - `runner`: a target's run: the corpus, `catch_unwind` around every input, timings, the
//!   watchdog; `alloc`: the counting, limited allocator the binary installs.

pub mod alloc;
pub mod mutate;
pub mod rng;
pub mod runner;
pub mod targets;

use std::path::Path;

pub use mutate::Grammar;
pub use rng::Rng;

/// What a parser made of one input: `Ok`, or its error message.
pub type Outcome = Result<(), String>;

/// A target's state: its fixtures on disk and the parser calls.
pub trait Harness {
    /// The inputs the run starts from: real files.
    fn seeds(&self) -> Vec<Vec<u8>>;
    /// Feeds `input` to the parsers; any `Err` is a fine answer, a panic is a bug.
    fn run(&mut self, input: &[u8]) -> Outcome;
}

/// One fuzz target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    pub name: &'static str,
    /// What it feeds, to which of kiln's functions.
    pub about: &'static str,
    pub grammar: Grammar,
    /// Tokens of the format for the mutations (keys, type names, magic bytes).
    pub dictionary: &'static [&'static [u8]],
    /// Repairs a mutated input's framing some of the time (a length prefix made to match), so
    /// that mutations reach past it.
    pub fixup: Option<fn(&mut Rng, &mut Vec<u8>)>,
    /// Builds the harness, with any fixtures it needs under the scratch directory given.
    pub make: fn(&Path) -> Result<Box<dyn Harness>, String>,
    /// A check of the harness itself (a panic, a hang, an allocation on purpose): run only
    /// when named.
    pub selftest: bool,
}

/// The outcome of several parsers on one input: `Ok` when all are, else every answer joined,
/// so that the outcome's signature tells the combinations apart.
#[derive(Debug, Default)]
pub struct Outcomes {
    answers: Vec<String>,
    failed: bool,
}

impl Outcomes {
    pub fn add<E: std::fmt::Display>(&mut self, outcome: Result<impl Sized, E>) -> &mut Self {
        match outcome {
            Ok(_) => self.answers.push("ok".to_owned()),
            Err(e) => {
                self.failed = true;
                self.answers.push(e.to_string());
            }
        }
        self
    }

    pub fn finish(&mut self) -> Outcome {
        if self.failed {
            Err(std::mem::take(&mut self.answers).join(" | "))
        } else {
            Ok(())
        }
    }
}
