//! What a model file is, told by its content (never its name): a `torch.export` program, a
//! TorchScript module or an AOTInductor package; and what an exported program takes as input,
//! read from its serialized graph (`models/*.json` in the archive).

use std::io::Read;
use std::path::Path;

use serde_json::Value;

use super::zipfile::ZipFile;
use crate::TrainError;

/// What a model file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// `torch.export.save(torch.export.export(model, …), path)`.
    ExportedProgram,
    /// `torch.jit.script(model).save(path)` (the older format).
    TorchScript,
    /// `torch._inductor.aoti_compile_and_package(…)`: native code compiled for one machine.
    AotiPackage,
}

impl FileKind {
    pub fn describe(self) -> &'static str {
        match self {
            FileKind::ExportedProgram => "an ExportedProgram (torch.export)",
            FileKind::TorchScript => "a TorchScript module (torch.jit)",
            FileKind::AotiPackage => "an AOTInductor package (compiled native code)",
        }
    }
}

/// How to save a program kiln trains.
pub const HOW_TO_EXPORT: &str = "save one with torch.export.save(torch.export.export(\
     model.train(), (example_batch,), dynamic_shapes=({0: torch.export.Dim(\"batch\")},)), \
     \"model.pt2\")";

pub(crate) fn file_error(path: &Path, message: String) -> TrainError {
    TrainError::File {
        path: path.to_owned(),
        message,
    }
}

/// What kiln trains, for errors about a file that is neither.
const WHAT_KILN_TRAINS: &str = "kiln trains a program saved with torch.export.save (.pt2) or a \
     TorchScript module saved with torch.jit.script(model.train()).save(path) (the older format)";

/// Opens `path` for the zip reader ([`ZipFile`]), saying plainly when it is missing.
fn open(path: &Path) -> Result<ZipFile, TrainError> {
    ZipFile::open(path).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "no such file".to_owned()
        } else {
            e.to_string()
        };
        file_error(path, why)
    })
}

/// The entries' names of the zip archive at `path`.
fn entries(path: &Path) -> Result<Vec<String>, TrainError> {
    let archive = zip::ZipArchive::new(open(path)?).map_err(|e| {
        file_error(
            path,
            format!(
                "neither an ExportedProgram nor a TorchScript module: not a zip archive ({e}); \
                 {WHAT_KILN_TRAINS}"
            ),
        )
    })?;
    Ok(archive.file_names().map(str::to_owned).collect())
}

/// Tells the model file at `path` apart by its content.
pub fn detect(path: &Path) -> Result<FileKind, TrainError> {
    let names = entries(path)?;
    let has = |suffix: &str| names.iter().any(|n| n.ends_with(suffix));
    let under = |part: &str| names.iter().any(|n| n.contains(part));
    if under("/data/aotinductor/") {
        Ok(FileKind::AotiPackage)
    } else if has("/archive_format") && under("/models/") && has(".json") {
        Ok(FileKind::ExportedProgram)
    } else if has("/data.pkl") && under("/code/") {
        Ok(FileKind::TorchScript)
    } else {
        Err(file_error(
            path,
            format!(
                "a zip archive that is neither an ExportedProgram nor a TorchScript module \
                 (entries: {}); {WHAT_KILN_TRAINS}",
                names.iter().take(4).cloned().collect::<Vec<_>>().join(", ")
            ),
        ))
    }
}

/// What an exported program takes, as its serialized graph records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramInput {
    /// The batch size, where the program was exported with a fixed one; `None` where its batch
    /// dimension is symbolic (`dynamic_shapes`).
    pub fixed_batch: Option<usize>,
    /// One sample's shape (the input's dimensions after the batch's).
    pub sample_shape: Vec<usize>,
    /// The input's dtype, as PyTorch names it (`float32`, `int64`, …).
    pub dtype: String,
    /// A second input's per-sample shape and dtype, for a program of exactly two inputs fed
    /// one features tensor: the targets, for a program that computes its own loss
    /// (`train.loss = module`).
    pub target: Option<(Vec<usize>, String)>,
    /// Every tensor input, in the order the program takes them.
    pub leaves: Vec<ProgramLeaf>,
    /// The torch version that saved it.
    pub torch_version: String,
}

/// One tensor input of a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramLeaf {
    /// A dict argument's key, or the argument's own name.
    pub name: String,
    pub sample_shape: Vec<usize>,
    pub dtype: String,
}

/// The name of a dtype code of torch.export's serialization schema (`ScalarType`).
fn dtype_name(code: Option<u64>) -> String {
    let name = match code {
        Some(1) => "uint8",
        Some(2) => "int8",
        Some(3) => "int16",
        Some(4) => "int32",
        Some(5) => "int64",
        Some(6) => "float16",
        Some(7) => "float32",
        Some(8) => "float64",
        Some(12) => "bool",
        Some(13) => "bfloat16",
        _ => return format!("dtype {}", code.map_or("?".to_owned(), |c| c.to_string())),
    };
    name.to_owned()
}

/// Reads the program's tensor inputs (features, and targets where it takes them) from `models/*.json` in the archive at `path`.
pub fn inspect(path: &Path) -> Result<ProgramInput, TrainError> {
    let model = model_json(path)?;
    let bad = |what: &str| {
        file_error(
            path,
            format!("its serialized program is not one kiln understands ({what})"),
        )
    };
    let graph = &model["graph_module"];
    let inputs: Vec<&str> = graph["signature"]["input_specs"]
        .as_array()
        .ok_or_else(|| bad("no input_specs"))?
        .iter()
        .filter_map(|s| s["user_input"]["arg"]["as_tensor"]["name"].as_str())
        .collect();
    let Some(&first) = inputs.first() else {
        return Err(file_error(
            path,
            format!("the program takes no tensor input: {HOW_TO_EXPORT}"),
        ));
    };
    let tensor = |name: &str| tensor_input(&graph["graph"]["tensor_values"][name], &bad);
    let names = leaf_names(graph).filter(|n| n.len() == inputs.len());
    let mut leaves = vec![];
    for (k, placeholder) in inputs.iter().enumerate() {
        let (_, sample_shape, dtype) = tensor(placeholder)?;
        let name = names.as_ref().map_or(*placeholder, |n| n[k].as_str());
        leaves.push(ProgramLeaf {
            name: name.to_owned(),
            sample_shape,
            dtype,
        });
    }
    let (fixed_batch, sample_shape, dtype) = tensor(first)?;
    let target = match &leaves[..] {
        [_, y] => Some((y.sample_shape.clone(), y.dtype.clone())),
        _ => None,
    };
    Ok(ProgramInput {
        fixed_batch,
        sample_shape,
        dtype,
        target,
        leaves,
        torch_version: model["torch_version"].as_str().unwrap_or("?").to_owned(),
    })
}

/// The name of each tensor input, in order, from the program's call signature: a dict
/// argument's keys, a tensor argument's own name; `None` where the signature is not one kiln
/// reads.
fn leaf_names(graph: &Value) -> Option<Vec<String>> {
    let signature = &graph["module_call_graph"].as_array()?.first()?["signature"];
    let spec: Value = serde_json::from_str(signature["in_spec"].as_str()?).ok()?;
    let arg_names: Vec<&str> = signature["forward_arg_names"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let args = spec.get(1)?["children_spec"].get(0)?["children_spec"].as_array()?;
    let mut names = vec![];
    for (i, arg) in args.iter().enumerate() {
        let arg_name = arg_names.get(i).copied().unwrap_or("arg");
        match arg["type"].as_str() {
            None => names.push(arg_name.to_owned()),
            Some("builtins.dict") => {
                let keys: Vec<Value> = serde_json::from_str(arg["context"].as_str()?).ok()?;
                names.extend(keys.iter().map(|k| match k {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }));
            }
            Some(_) => return None,
        }
    }
    Some(names)
}

/// One tensor input's batch size (where fixed), per-sample shape and dtype.
fn tensor_input(
    value: &Value,
    bad: &dyn Fn(&str) -> TrainError,
) -> Result<(Option<usize>, Vec<usize>, String), TrainError> {
    let sizes = value["sizes"]
        .as_array()
        .ok_or_else(|| bad("no input sizes"))?;
    let fixed = |v: &Value| v["as_int"].as_u64().map(|n| n as usize);
    let first = sizes.first().ok_or_else(|| bad("a 0-dimensional input"))?;
    let sample_shape = sizes[1..]
        .iter()
        .map(|d| fixed(d).ok_or_else(|| bad("a symbolic dimension after the batch")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((
        fixed(first),
        sample_shape,
        dtype_name(value["dtype"].as_u64()),
    ))
}

/// The program's `models/<name>.json`.
fn model_json(path: &Path) -> Result<Value, TrainError> {
    let file = open(path)?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| file_error(path, format!("not a zip: {e}")))?;
    let name = archive
        .file_names()
        .find(|n| n.contains("/models/") && n.ends_with(".json"))
        .map(str::to_owned)
        .ok_or_else(|| file_error(path, format!("no models/*.json: {HOW_TO_EXPORT}")))?;
    let mut text = String::new();
    archive
        .by_name(&name)
        .map_err(|e| file_error(path, format!("{name}: {e}")))?
        .read_to_string(&mut text)
        .map_err(|e| file_error(path, format!("{name}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| file_error(path, format!("{name}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn archive(dir: &Path, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let path = dir.join(name);
        let mut zip = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
        for (entry, text) in files {
            zip.start_file(*entry, zip::write::FileOptions::default())
                .unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    fn model_json(batch: &str) -> String {
        format!(
            r#"{{"torch_version": "2.11.0", "graph_module": {{
                "signature": {{"input_specs": [
                    {{"parameter": {{"arg": {{"name": "p_w"}}}}}},
                    {{"user_input": {{"arg": {{"as_tensor": {{"name": "x"}}}}}}}}]}},
                "graph": {{"tensor_values": {{"x": {{"dtype": 7, "sizes": [{batch},
                    {{"as_int": 3}}, {{"as_int": 4}}]}}}}}}}}}}"#
        )
    }

    #[test]
    fn files_are_told_apart_by_content_not_name() {
        let tmp = tempfile::tempdir().unwrap();
        let json = model_json(r#"{"as_int": 8}"#);
        let program = archive(
            tmp.path(),
            "looks-like-torchscript.pt",
            &[("m/archive_format", "pt2"), ("m/models/model.json", &json)],
        );
        assert_eq!(detect(&program).unwrap(), FileKind::ExportedProgram);
        let script = archive(
            tmp.path(),
            "model.pt2",
            &[("m/data.pkl", ""), ("m/code/__torch__/m.py", "")],
        );
        assert_eq!(detect(&script).unwrap(), FileKind::TorchScript);
        let package = archive(
            tmp.path(),
            "p.pt2",
            &[
                ("p/archive_format", "pt2"),
                ("p/data/aotinductor/model/a.wrapper.so", ""),
            ],
        );
        assert_eq!(detect(&package).unwrap(), FileKind::AotiPackage);
        let other = archive(tmp.path(), "o.zip", &[("readme.txt", "hi")]);
        let e = detect(&other).unwrap_err().to_string();
        assert!(
            e.contains("neither an ExportedProgram") && e.contains("torch.export"),
            "{e}"
        );
        let text = tmp.path().join("notes.pt2");
        std::fs::write(&text, "not a zip").unwrap();
        let e = detect(&text).unwrap_err().to_string();
        assert!(
            e.contains("not a zip archive") && e.contains("notes.pt2"),
            "{e}"
        );
    }

    #[test]
    fn the_input_is_read_with_a_fixed_or_symbolic_batch() {
        let tmp = tempfile::tempdir().unwrap();
        let fixed = model_json(r#"{"as_int": 8}"#);
        let p = archive(tmp.path(), "f.pt2", &[("m/models/model.json", &fixed)]);
        let input = inspect(&p).unwrap();
        assert_eq!(input.fixed_batch, Some(8));
        assert_eq!(input.sample_shape, [3, 4]);
        assert_eq!(input.torch_version, "2.11.0");
        assert_eq!(input.dtype, "float32");
        let symbolic = model_json(r#"{"as_expr": {"expr_str": "s0", "hint": {"as_int": 8}}}"#);
        let p = archive(tmp.path(), "d.pt2", &[("m/models/model.json", &symbolic)]);
        assert_eq!(inspect(&p).unwrap().fixed_batch, None);
    }

    #[test]
    fn inputs_are_named_by_a_dict_arguments_keys_and_tensor_arguments_names() {
        // forward(self, inputs: dict with x and cat, target), as torch.export serializes it.
        let in_spec = r#"[1, {"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.tuple", "context": "null", "children_spec": [{"type": "builtins.dict", "context": "[\"x\", \"cat\"]", "children_spec": [{"type": null, "context": null, "children_spec": []}, {"type": null, "context": null, "children_spec": []}]}, {"type": null, "context": null, "children_spec": []}]}, {"type": "builtins.dict", "context": "[]", "children_spec": []}]}]"#;
        let tensor = |dtype: u8, dims: &str| {
            format!(r#"{{"dtype": {dtype}, "sizes": [{{"as_expr": "s0"}}{dims}]}}"#)
        };
        let json = format!(
            r#"{{"torch_version": "2.11.0", "graph_module": {{
                "signature": {{"input_specs": [
                    {{"user_input": {{"arg": {{"as_tensor": {{"name": "inputs_x"}}}}}}}},
                    {{"user_input": {{"arg": {{"as_tensor": {{"name": "inputs_cat"}}}}}}}},
                    {{"user_input": {{"arg": {{"as_tensor": {{"name": "target"}}}}}}}}]}},
                "module_call_graph": [{{"fqn": "", "signature": {{"in_spec": {in_spec},
                    "forward_arg_names": ["inputs", "target"]}}}}],
                "graph": {{"tensor_values": {{"inputs_x": {x}, "inputs_cat": {cat},
                    "target": {y}}}}}}}}}"#,
            in_spec = serde_json::to_string(in_spec).unwrap(),
            x = tensor(7, r#", {"as_int": 4}"#),
            cat = tensor(5, ""),
            y = tensor(7, r#", {"as_int": 2}"#),
        );
        let tmp = tempfile::tempdir().unwrap();
        let p = archive(tmp.path(), "d.pt2", &[("m/models/model.json", &json)]);
        let input = inspect(&p).unwrap();
        let leaves: Vec<(&str, &[usize], &str)> = input
            .leaves
            .iter()
            .map(|l| (l.name.as_str(), &l.sample_shape[..], l.dtype.as_str()))
            .collect();
        let want: [(&str, &[usize], &str); 3] = [
            ("x", &[4], "float32"),
            ("cat", &[], "int64"),
            ("target", &[2], "float32"),
        ];
        assert_eq!(leaves, want);
        assert_eq!(input.fixed_batch, None);
    }
}
