//! Model archives (`.pt2` exported programs, TorchScript `.pt`, AOTInductor packages): what
//! kiln reads of the zip itself before handing a file to libtorch or PyTorch, whose own
//! loaders are not fuzzed in-process: `program::detect` (the kind, by the entries' names),
//! `program::inspect` (the inputs, from `models/*.json`) and `ModelSource::detect`.
//! Mutated archives have their JSON re-zipped half of the time, so that mutations of the
//! serialized program reach past the zip's checksums.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use kiln_infer::ModelSource;
use kiln_train::program;
use zip::write::FileOptions;

use super::{text, write};
use crate::mutate::json_span;
use crate::{Grammar, Harness, Outcome, Outcomes, Rng, Target};

pub const TARGET: Target = Target {
    name: "model-archive",
    about: ".pt2/.pt zip bytes → program::detect, program::inspect, ModelSource::detect",
    grammar: Grammar::Json,
    dictionary: &[
        b"PK\x03\x04",
        b"PK\x01\x02",
        b"PK\x05\x06",
        b"PK\x06\x06",
        b"PK\x06\x07",
        b"/archive_format",
        b"/models/",
        b".json",
        b"/data.pkl",
        b"/code/",
        b"/data/aotinductor/",
        b"\"as_int\"",
        b"\"as_expr\"",
        b"\"sizes\"",
        b"\"dtype\"",
        b"\"input_specs\"",
        b"\"user_input\"",
        b"\"tensor_values\"",
        b"\"in_spec\"",
        b"\"builtins.dict\"",
        b"\"context\"",
        b"\xff\xff\xff\xff",
        b"\xff\xff",
    ],
    fixup: Some(rezip),
    make,
    selftest: false,
};

const TORCHSCRIPT: &[u8] = include_bytes!("../../../crates/infer/tests/data/tiny_mlp.pt");

/// A zip archive of `files`, stored, as PyTorch writes its archives.
fn zipped(files: &[(&str, &[u8])]) -> Result<Vec<u8>, String> {
    let mut zip = zip::ZipWriter::new(Cursor::new(vec![]));
    for (name, bytes) in files {
        zip.start_file(*name, FileOptions::default())
            .map_err(text)?;
        zip.write_all(bytes).map_err(text)?;
    }
    Ok(zip.finish().map_err(text)?.into_inner())
}

/// An exported program's archive holding `model_json` as its serialized graph.
fn program_archive(model_json: &[u8]) -> Result<Vec<u8>, String> {
    zipped(&[
        ("model/archive_format", b"pt2"),
        ("model/models/model.json", model_json),
        ("model/data/weights/model_weights_config.json", b"{}"),
    ])
}

/// Re-zips the serialized program of a mutated archive, half of the time.
fn rezip(rng: &mut Rng, input: &mut Vec<u8>) {
    if !rng.one_in(2) {
        return;
    }
    if let Some((start, end)) = json_span(input)
        && let Ok(archive) = program_archive(&input[start..end])
    {
        *input = archive;
    }
}

/// A program's `models/model.json` as torch.export writes it: one input `x` of `[batch, 3, 4]`
/// floats, or two named by a dict argument.
fn model_json(dict: bool) -> String {
    let in_spec = r#"[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.dict", "context": "[\"x\", \"cat\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}]"#;
    let call_graph = if dict {
        format!(
            r#", "module_call_graph": [{{"fqn": "", "signature": {{"in_spec": {}, "forward_arg_names": ["inputs"]}}}}]"#,
            serde_json::Value::from(in_spec)
        )
    } else {
        String::new()
    };
    format!(
        r#"{{"torch_version": "2.11.0", "graph_module": {{
            "signature": {{"input_specs": [
                {{"parameter": {{"arg": {{"name": "p_w"}}}}}},
                {{"user_input": {{"arg": {{"as_tensor": {{"name": "x"}}}}}}}},
                {{"user_input": {{"arg": {{"as_tensor": {{"name": "cat"}}}}}}}}]}}{call_graph},
            "graph": {{"tensor_values": {{
                "x": {{"dtype": 7, "sizes": [{{"as_expr": {{"expr_str": "s0", "hint": {{"as_int": 8}}}}}}, {{"as_int": 3}}, {{"as_int": 4}}]}},
                "cat": {{"dtype": 5, "sizes": [{{"as_int": 8}}]}}}}}}}}}}"#
    )
}

struct Archive {
    file: PathBuf,
    seeds: Vec<Vec<u8>>,
}

fn make(scratch: &Path) -> Result<Box<dyn Harness>, String> {
    let seeds = vec![
        TORCHSCRIPT.to_vec(),
        program_archive(model_json(false).as_bytes())?,
        program_archive(model_json(true).as_bytes())?,
        zipped(&[
            ("p/archive_format", b"pt2"),
            ("p/data/aotinductor/model/a.wrapper.so", b"\x7fELF"),
        ])?,
    ];
    Ok(Box::new(Archive {
        file: scratch.join("model.pt2"),
        seeds,
    }))
}

impl Harness for Archive {
    fn seeds(&self) -> Vec<Vec<u8>> {
        self.seeds.clone()
    }

    fn run(&mut self, input: &[u8]) -> Outcome {
        write(&self.file, input)?;
        let mut o = Outcomes::default();
        o.add(program::detect(&self.file).map(|k| k.describe()));
        o.add(program::inspect(&self.file).map(|i| i.leaves.len()));
        o.add(ModelSource::detect(&self.file).map(drop));
        o.finish()
    }
}
