//! Hardware profile files (a user's profile directory, `device.profiles_dir`): a profile's TOML
//! through `Profile::parse`, then beside kiln's own (`ProfileSet::from_profiles`: names and
//! patterns unique) and matched against GPU names.

use std::path::{Path, PathBuf};

use kiln_profiles::{Origin, Profile, ProfileSet};

use super::text;
use crate::{Grammar, Harness, Outcome, Target};

pub const TARGET: Target = Target {
    name: "profile-toml",
    about: "a profile .toml → Profile::parse, ProfileSet::from_profiles with the built-in \
            profiles, match_gpu",
    grammar: Grammar::Text,
    dictionary: &[
        b"name",
        b"match",
        b"memory_gib",
        b"compute_capability",
        b"train_batch_size",
        b"infer_batch_size",
        b"num_workers",
        b"memory_fraction",
        b"matmul_precision",
        b"\"h100\"",
        b"\"\"",
        b"[]",
        b"4294967296",
        b"-1",
        b"1e400",
        b"\"99.99\"",
    ],
    fixup: None,
    make,
    selftest: false,
};

/// kiln's own profiles, the files it embeds.
const BUILTIN: [&[u8]; 14] = [
    include_bytes!("../../../profiles/a10.toml"),
    include_bytes!("../../../profiles/a100.toml"),
    include_bytes!("../../../profiles/apple-mps.toml"),
    include_bytes!("../../../profiles/b200.toml"),
    include_bytes!("../../../profiles/generic-cpu.toml"),
    include_bytes!("../../../profiles/h100.toml"),
    include_bytes!("../../../profiles/h200.toml"),
    include_bytes!("../../../profiles/l4.toml"),
    include_bytes!("../../../profiles/l40s.toml"),
    include_bytes!("../../../profiles/rtx3090.toml"),
    include_bytes!("../../../profiles/rtx4090.toml"),
    include_bytes!("../../../profiles/rtx5090.toml"),
    include_bytes!("../../../profiles/t4.toml"),
    include_bytes!("../../../profiles/v100.toml"),
];

struct Profiles {
    builtin: Vec<Profile>,
    origin: PathBuf,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let builtin = ProfileSet::builtin().map_err(text)?;
    Ok(Box::new(Profiles {
        builtin: builtin.all().to_vec(),
        origin: scratch.join("mine.toml"),
    }))
}

impl Harness for Profiles {
    fn seeds(&self) -> Vec<Vec<u8>> {
        BUILTIN.iter().map(|t| t.to_vec()).collect()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        let text_in = std::str::from_utf8(input).map_err(text)?;
        let profile = Profile::parse(text_in, Origin::User(self.origin.clone())).map_err(text)?;
        let mut all: Vec<Profile> = self
            .builtin
            .iter()
            .filter(|b| b.name != profile.name)
            .cloned()
            .collect();
        all.push(profile);
        let set = ProfileSet::from_profiles(all).map_err(text)?;
        for gpu in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA A10G",
            "Tesla V100-SXM2-16GB",
            "",
        ] {
            set.match_gpu(gpu).map_err(text)?;
        }
        Ok(())
    }
}
