//! ONNX files: what kiln reads of one itself (`onnx::metadata::read`, a walk over the
//! `ModelProto`'s top-level fields for its `metadata_props`, before any engine loads it).
//! ONNX Runtime's own reading of the file is a foreign loader's and not fuzzed here.

use std::path::{Path, PathBuf};

use kiln_infer::onnx::metadata;

use super::{text, write};
use crate::{Grammar, Harness, Outcome, Target};

pub const TARGET: Target = Target {
    name: "onnx-metadata",
    about: ".onnx bytes → onnx::metadata::read (kiln's walk over the protobuf's top-level \
            fields for metadata_props)",
    grammar: Grammar::Binary,
    dictionary: &[
        b"\x72",
        b"\x72\xff\xff\xff\xff\x0f",
        b"\x72\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        b"\x3a\x80\x80\x80\x80\x10",
        b"\x0a\x0bkiln.source",
        b"\x12\x07/runs/a",
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        b"\x09\x01\x02\x03\x04\x05\x06\x07\x08",
        b"\x0d\x01\x02\x03\x04",
    ],
    fixup: None,
    make,
    selftest: false,
};

const TINY_MLP: &[u8] = include_bytes!("../../../crates/infer/tests/data/tiny_mlp.onnx");
const TINY_MLP_BATCH2: &[u8] =
    include_bytes!("../../../crates/infer/tests/data/tiny_mlp_batch2.onnx");

/// A length-delimited protobuf field.
fn field(number: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

/// `model` with the metadata `kiln export` records (`metadata_props` entries appended).
fn with_metadata(model: &[u8]) -> Vec<u8> {
    let mut out = model.to_vec();
    for (key, value) in [
        ("kiln.source", "/runs/a/checkpoints/step-000000040"),
        ("kiln.task", "classification"),
    ] {
        let mut entry = field(1, key.as_bytes());
        entry.extend(field(2, value.as_bytes()));
        out.extend(field(14, &entry));
    }
    out
}

struct Onnx {
    file: PathBuf,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    Ok(Box::new(Onnx {
        file: scratch.join("model.onnx"),
    }))
}

impl Harness for Onnx {
    fn seeds(&self) -> Vec<Vec<u8>> {
        vec![
            TINY_MLP.to_vec(),
            TINY_MLP_BATCH2.to_vec(),
            with_metadata(TINY_MLP),
        ]
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.file, input)?;
        let props = metadata::read(&self.file).map_err(text)?;
        metadata::get(&props, "kiln.source");
        Ok(())
    }
}
