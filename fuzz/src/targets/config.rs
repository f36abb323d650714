//! Configuration files: a user's `--config` file (TOML, YAML or JSON, a target each) through
//! kiln's whole loading path (`kiln_config::load`: the layers, the device section, profile
//! matching, validation into a plan) for a simulated machine with one H100.

use std::path::{Path, PathBuf};

use kiln_config::{ConfigRequest, Machine};
use kiln_core::CpuFacts;
use kiln_profiles::ProfileSet;

use super::{text, write};
use crate::{Grammar, Harness, Outcome, Target};

/// Section and key names, values kiln's options take, and values that break them.
const DICTIONARY: &[&[u8]] = &[
    b"device",
    b"request",
    b"profile",
    b"profiles_dir",
    b"performance",
    b"matmul_precision",
    b"data",
    b"num_workers",
    b"prefetch_factor",
    b"model",
    b"train",
    b"batch_size",
    b"lr",
    b"amp",
    b"epochs",
    b"max_time",
    b"infer",
    b"sliding_window",
    b"roi",
    b"serve",
    b"port",
    b"profiling",
    b"auto",
    b"cuda:99",
    b"cpu",
    b"bf16",
    b"fp16",
    b"transformer",
    b"\"1000000000000,1000000000000\"",
    b"\"\"",
    b"-1",
    b"1e400",
    b"\"01:30:00\"",
    b"\"99999999:00:00\"",
    b"\"/proc\"",
    b"\"..\"",
];

pub const TOML: Target = Target {
    name: "config-toml",
    about: "a --config .toml file → kiln_config::load (layers, device, profile, plan)",
    grammar: Grammar::Text,
    dictionary: DICTIONARY,
    fixup: None,
    make: |scratch| make(scratch, "toml"),
    selftest: false,
};

pub const YAML: Target = Target {
    name: "config-yaml",
    about: "a --config .yaml file → kiln_config::load (layers, device, profile, plan)",
    grammar: Grammar::Text,
    dictionary: DICTIONARY,
    fixup: None,
    make: |scratch| make(scratch, "yaml"),
    selftest: false,
};

pub const JSON: Target = Target {
    name: "config-json",
    about: "a --config .json file → kiln_config::load (layers, device, profile, plan)",
    grammar: Grammar::Json,
    dictionary: DICTIONARY,
    fixup: None,
    make: |scratch| make(scratch, "json"),
    selftest: false,
};

/// A simulated machine: one H100 beside a 16-core CPU with bf16.
pub(crate) fn machine() -> Result<Machine, String> {
    let cpu = CpuFacts {
        model: "fuzz".into(),
        physical_cores: 16,
        logical_cores: 16,
        total_memory_bytes: 64 << 30,
        available_memory_bytes: 60 << 30,
        avx512: true,
        avx512_bf16: true,
        amx_bf16: true,
    };
    let profiles = ProfileSet::builtin().map_err(text)?;
    let facts = kiln_config::simulated_machine(
        &profiles,
        Some("NVIDIA H100 80GB HBM3"),
        None,
        None,
        None,
        cpu,
    )
    .map_err(text)?;
    Ok(Machine::Simulated(facts))
}

/// The seed files of a format: the README's configuration for TOML, small files for each.
fn seeds(ext: &str) -> Vec<Vec<u8>> {
    match ext {
        "toml" => vec![
            include_bytes!("../../seeds/config/readme.toml").to_vec(),
            include_bytes!("../../seeds/config/small.toml").to_vec(),
        ],
        "yaml" => vec![include_bytes!("../../seeds/config/small.yaml").to_vec()],
        _ => vec![include_bytes!("../../seeds/config/small.json").to_vec()],
    }
}

struct Config {
    file: PathBuf,
    request: ConfigRequest,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path, ext: &str) -> Result<Box<dyn Harness>, String> {
    let file = scratch.join(format!("kiln.{ext}"));
    let mut request = ConfigRequest::new(machine()?);
    request.file = Some(file.clone());
    Ok(Box::new(Config {
        file,
        request,
        seeds: seeds(ext),
    }))
}

impl Harness for Config {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.file, input)?;
        kiln_config::load(&self.request).map(drop).map_err(text)
    }
}
