//! safetensors files: a checkpoint's weights (`weights::from_safetensors`, into CPU tensors),
//! the quick check of a checkpoint's tensor files (`checkpoint::check_quick`, which reads their
//! headers itself) and a dataset's safetensors shard (`ShardedDataset::open`), each on the same
//! bytes.

use std::path::{Path, PathBuf};

use kiln_data::{ShardFormat, ShardedDataset};
use kiln_train::checkpoint;
use tch::{Kind, Tensor};

use super::checkpoint::fixture_checkpoint;
use super::{files_ending, prepared_dataset, read, text, write};
use crate::mutate::json_span;
use crate::{Grammar, Harness, Outcome, Outcomes, Rng, Target};

pub const TARGET: Target = Target {
    name: "safetensors",
    about: "safetensors bytes → weights::from_safetensors, checkpoint::check_quick of a \
            checkpoint's model.safetensors, a dataset's safetensors shard (ShardedDataset::open)",
    grammar: Grammar::Json,
    dictionary: &[
        b"\"dtype\"",
        b"\"shape\"",
        b"\"data_offsets\"",
        b"\"__metadata__\"",
        b"\"F32\"",
        b"\"F64\"",
        b"\"F16\"",
        b"\"BF16\"",
        b"\"I64\"",
        b"\"I32\"",
        b"\"U8\"",
        b"\"BOOL\"",
        b"\"F8_E4M3\"",
        b"\"C64\"",
        b"\"features\"",
        b"\"labels\"",
        b"[1000000000000]",
        b"[4294967296,4294967296]",
        b"[0,18446744073709551615]",
        b"[]",
    ],
    fixup: Some(fix_header_length),
    make,
    selftest: false,
};

/// Sets the 8-byte header length to the JSON header's, half of the time.
#[allow(
    clippy::ptr_arg,
    reason = "a target's fixup, whose type lets others resize the input"
)]
fn fix_header_length(rng: &mut Rng, input: &mut Vec<u8>) {
    if !rng.one_in(2) || input.len() < 10 {
        return;
    }
    if let Some((8, end)) = json_span(&input[8..]).map(|(s, e)| (s + 8, e + 8)) {
        input[..8].copy_from_slice(&((end - 8) as u64).to_le_bytes());
    }
}

struct Safetensors {
    dataset: PathBuf,
    shard: PathBuf,
    checkpoint: PathBuf,
    weights: PathBuf,
    seeds: Vec<Vec<u8>>,
}

/// Named tensors of several kinds, as kiln writes weights.
fn written_by_kiln() -> Result<Vec<u8>, String> {
    let tensors = [
        (
            "w".to_owned(),
            Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).view([2, 3]),
        ),
        ("b".to_owned(), Tensor::from_slice(&[1i64, 2])),
        (
            "h".to_owned(),
            Tensor::ones([3], (Kind::Half, tch::Device::Cpu)),
        ),
        ("s".to_owned(), Tensor::from(2.5f64)),
    ];
    checkpoint::to_safetensors(&tensors).map_err(text)
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let dataset = prepared_dataset(scratch, &scratch.join("dataset"), ShardFormat::Safetensors)?;
    let shard = files_ending(&dataset, ".safetensors")?
        .into_iter()
        .next()
        .ok_or("the prepared dataset has no shard")?;
    let checkpoint = fixture_checkpoint(scratch)?;
    let weights = checkpoint.join(checkpoint::MODEL_FILE);
    let seeds = vec![
        read(&shard)?,
        read(&weights)?,
        read(&checkpoint.join(checkpoint::STATE_FILE))?,
        written_by_kiln()?,
    ];
    Ok(Box::new(Safetensors {
        dataset,
        shard,
        checkpoint,
        weights,
        seeds,
    }))
}

impl Harness for Safetensors {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        let mut o = Outcomes::default();
        let tensors = checkpoint::from_safetensors(input, Path::new("input.safetensors"));
        o.add(tensors.map(|t| t.len()));
        write(&self.weights, input)?;
        o.add(checkpoint::check_quick(&self.checkpoint));
        write(&self.shard, input)?;
        o.add(ShardedDataset::open(&self.dataset));
        o.finish()
    }
}
