//! The harness's own checks: targets that fail on purpose on inputs starting with `!` (a
//! panic, a hang, an allocation past the limits), so that tests see each failure caught,
//! counted and its input written out. Their seeds are `fine`, `!` and `!!`, in that order, so
//! that `--inputs 2` meets one failure. Run only when named.

use std::path::Path;
use std::time::Duration;

use crate::{Grammar, Harness, Outcome, Target};

pub const PANIC: Target = selftest(
    "selftest-panic",
    "panics on an input starting with `!`",
    |_| Ok(Box::new(SelfTest(Misbehaviour::Panic))),
);
pub const HANG: Target = selftest(
    "selftest-hang",
    "sleeps 1.5 s on an input starting with `!`, forever on `!!`",
    |_| Ok(Box::new(SelfTest(Misbehaviour::Hang))),
);
pub const MEMORY: Target = selftest(
    "selftest-memory",
    "asks for 1 TiB on an input starting with `!`",
    |_| Ok(Box::new(SelfTest(Misbehaviour::Memory))),
);

const fn selftest(
    name: &'static str,
    about: &'static str,
    make: fn(&Path) -> Result<Box<dyn Harness>, String>,
) -> Target {
    Target {
        name,
        about,
        grammar: Grammar::Binary,
        dictionary: &[b"!"],
        fixup: None,
        make,
        selftest: true,
    }
}

#[derive(Debug, Clone, Copy)]
enum Misbehaviour {
    Panic,
    Hang,
    Memory,
}

struct SelfTest(Misbehaviour);

impl Harness for SelfTest {
    fn seeds(&self) -> Vec<Vec<u8>> {
        vec![b"fine".to_vec(), b"!".to_vec(), b"!!".to_vec()]
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        if input.starts_with(b"!") {
            match self.0 {
                Misbehaviour::Panic => panic!("a panic on purpose"),
                Misbehaviour::Hang if input.starts_with(b"!!") => loop {
                    std::thread::sleep(Duration::from_secs(1));
                },
                Misbehaviour::Hang => std::thread::sleep(Duration::from_millis(1500)),
                Misbehaviour::Memory => {
                    std::hint::black_box(vec![1u8; 1 << 40]);
                }
            }
        }
        Err(format!("{} bytes", input.len()))
    }
}
