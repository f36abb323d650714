//! kiln's hardware profiles: tuned per-GPU settings (batch sizes, workers, memory fraction,
//! precision, TF32, cuDNN flags) kept as TOML data in the repository's `profiles/` directory and
//! embedded at build time, extendable and overridable from a directory of the user's.
//!
//! [`ProfileSet`] holds the profiles and matches NVML names to them; [`resolve`] turns a selected
//! device and the machine's facts into the profile a run starts from: matched, corrected for
//! what the hardware cannot do, or derived for a GPU no profile names.
//!
//! Layering: knows `kiln-core`'s plain facts and options, nothing else of kiln, and no libtorch.

mod error;
mod matching;
mod profile;
mod resolve;
mod set;

pub use error::ProfileError;
pub use matching::{ProfileMatch, tokenize};
pub use profile::{DEFAULT_SLIDING_WINDOW_BATCH, Origin, Profile, ProfileDevice};
pub use resolve::{Adjustment, Basis, Resolved, resolve};
pub use set::{ProfileSet, edit_distance};

mod builtin {
    include!(concat!(env!("OUT_DIR"), "/builtin_profiles.rs"));
}
