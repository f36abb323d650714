//! `.npy` files: kiln's header parser (`npy_parse_header`), an array held in memory
//! (`NpyArray::parse`, as request bodies and sliding-window inputs are read), a dataset's `.npy`
//! shard (`ShardedDataset::open`, memory-mapped) and `kiln data prepare` of `.npy` features or
//! targets (`prepare`), each on the same bytes.

use std::path::{Path, PathBuf};

use kiln_data::{DType, NpyArray, PrepareOptions, PrepareSource, ShardFormat, ShardedDataset};

use super::{files_ending, npy_bytes, prepared_dataset, read, remove_dir, text, write};
use crate::{Grammar, Harness, Outcome, Outcomes, Rng, Target};

pub const TARGET: Target = Target {
    name: "npy",
    about: ".npy bytes → npy_parse_header, NpyArray::parse, a dataset's .npy shard \
            (ShardedDataset::open), kiln data prepare of .npy features and targets",
    grammar: Grammar::Text,
    dictionary: &[
        b"\x93NUMPY",
        b"'descr'",
        b"'<f4'",
        b"'<f8'",
        b"'<f2'",
        b"'|u1'",
        b"'|i1'",
        b"'<i8'",
        b"'<i4'",
        b"'|b1'",
        b"'>f4'",
        b"'<c8'",
        b"'fortran_order'",
        b"False",
        b"True",
        b"'shape'",
        b"(1000000000000,)",
        b"(4294967296, 4294967296)",
        b"(9223372036854775807, 3)",
        b"(0,)",
        b"()",
        b"(-1,)",
        b"{",
        b"}",
        b", ",
        b"L",
    ],
    fixup: Some(fix_header_length),
    make,
    selftest: false,
};

/// Sets the header length field (version 1: 2 bytes, 2 and 3: 4 bytes) to where the header
/// text's line ends, half of the time: a mutated header then still reads whole.
#[allow(
    clippy::ptr_arg,
    reason = "a target's fixup, whose type lets others resize the input"
)]
pub(crate) fn fix_header_length(rng: &mut Rng, input: &mut Vec<u8>) {
    if !rng.one_in(2) || input.len() < 12 || !input.starts_with(b"\x93NUMPY") {
        return;
    }
    let start = if input[6] == 1 { 10 } else { 12 };
    let Some(end) = input[start..].iter().position(|&b| b == b'\n') else {
        return;
    };
    let len = end + 1;
    if start == 10 {
        if let Ok(len) = u16::try_from(len) {
            input[8..10].copy_from_slice(&len.to_le_bytes());
        }
    } else if let Ok(len) = u32::try_from(len) {
        input[8..12].copy_from_slice(&len.to_le_bytes());
    }
}

struct Npy {
    /// A dataset of `.npy` shards; its first features shard is overwritten by each input.
    dataset: PathBuf,
    shard: PathBuf,
    /// Where each input goes as the source of `prepare`, and the other source array.
    input: PathBuf,
    features: PathBuf,
    labels: PathBuf,
    out: PathBuf,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let dataset = prepared_dataset(scratch, &scratch.join("dataset"), ShardFormat::Npy)?;
    let shards = files_ending(&dataset, ".npy")?;
    let shard = shards
        .iter()
        .find(|p| p.to_string_lossy().ends_with("features.npy"))
        .cloned()
        .ok_or("the prepared dataset has no features shard")?;
    let mut seeds = shards
        .iter()
        .map(|p| read(p))
        .collect::<Result<Vec<_>, _>>()?;
    for (dtype, shape) in [
        (DType::U8, vec![6, 2, 2]),
        (DType::I32, vec![6]),
        (DType::F64, vec![3]),
        (DType::F16, vec![6, 1]),
        (DType::Bool, vec![6]),
        (DType::I16, vec![2, 3]),
    ] {
        seeds.push(npy_bytes(dtype, &shape)?);
    }
    seeds.push(kiln_data::npy_f32_bytes(
        &[2, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, -6.5],
    )?);
    let features = scratch.join("features.npy");
    let labels = scratch.join("labels.npy");
    write(&features, &npy_bytes(DType::F32, &[6, 4])?)?;
    write(&labels, &npy_bytes(DType::I64, &[6])?)?;
    Ok(Box::new(Npy {
        dataset,
        shard,
        input: scratch.join("input.npy"),
        features,
        labels,
        out: scratch.join("prepared"),
        seeds,
    }))
}

impl Npy {
    /// `kiln data prepare` of `source` into a new directory, removed again.
    fn prepare(&self, source: PrepareSource) -> Outcome {
        let options = PrepareOptions::default();
        let prepared = kiln_data::prepare(&source, &self.out, &options).map(drop);
        remove_dir(&self.out);
        prepared.map_err(text)
    }
}

impl Harness for Npy {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        let mut o = Outcomes::default();
        o.add(NpyArray::parse(input).map(|a| a.to_f32().len()));
        // Every reader below parses the header first: a header that does not parse fails
        // them all alike, so only its own error is worth the files.
        if let Err(e) = kiln_data::npy_parse_header(input) {
            return o.add(Err::<(), _>(e)).finish();
        }
        write(&self.shard, input)?;
        o.add(ShardedDataset::open(&self.dataset));
        write(&self.input, input)?;
        o.add(self.prepare(PrepareSource::Npy {
            features: self.input.clone(),
            labels: self.labels.clone(),
        }));
        o.add(self.prepare(PrepareSource::NpyTargets {
            features: self.features.clone(),
            targets: self.input.clone(),
            classes: None,
        }));
        o.finish()
    }
}
