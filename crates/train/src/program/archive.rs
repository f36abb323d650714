//! kiln's own check of a model archive (a TorchScript module, a `torch.export` program) before
//! any of it reaches libtorch or Python: loading either must never run code beyond the model's
//! tensor program. Refused are pickles that import anything but the tensor, storage and
//! container types PyTorch's writers emit ([`pickle::scan`] walks every pickle, also inside the
//! `torch.save` archives a program nests, without running it); native libraries and
//! AOTInductor packages (kiln loads compiled code only from its own compile cache); pickled
//! TorchScript objects; symbolic shape expressions other than the `Symbol(…)`, `Integer(…)`,
//! `FloorDiv(…)` forms `torch.export` writes (PyTorch reads them with `sympy.sympify`, that is
//! `eval`); entries with path traversal, duplicate names, unknown compression or impossible
//! sizes. [`vet_bytes`] takes any bytes and never panics.

use std::collections::{BTreeSet, HashSet};
use std::io::{Cursor, Read, Seek};
use std::path::Path;

use serde_json::Value;

use super::pickle::{self, PickleError};
use super::zipfile::ZipFile;
use crate::TrainError;

/// The most entries an archive may hold.
const MAX_ENTRIES: usize = 1 << 20;
/// The largest pickle or JSON entry read.
const MAX_SCANNED: u64 = 256 << 20;
/// The largest nested archive (a program's `torch.save`d sample inputs) read.
const MAX_NESTED: u64 = 1 << 30;
/// The longest symbolic expression.
const MAX_EXPRESSION: usize = 1 << 16;
/// Deflate expands at most about 1032:1.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// What a vetted archive is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    /// `torch.jit.save`: code the TorchScript compiler reads, and pickles of its objects.
    TorchScript,
    /// `torch.export.save`.
    ExportedProgram,
    /// Neither (`torch.save`, or anything else): its pickles are held to the tensor types.
    Other,
}

/// Why a model archive is refused. `entry` names the archive entry (`outer!/inner` inside a
/// nested archive).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    #[error("not a zip archive ({0})")]
    NotAnArchive(String),
    #[error("{entry}: {why}")]
    Entry { entry: String, why: String },
    #[error(
        "{entry}: native code ({what}); kiln runs compiled code only from packages it compiled \
         itself, in its own cache"
    )]
    NativeCode { entry: String, what: &'static str },
    #[error(
        "{entry}: {source}; kiln loads from a model file only tensors and the types PyTorch \
         stores them with"
    )]
    Pickle { entry: String, source: PickleError },
    #[error(
        "{entry}: the shape expression `{expr}` is not one torch.export writes ({why}): \
         PyTorch would evaluate it as Python"
    )]
    Expression {
        entry: String,
        expr: String,
        why: String,
    },
}

fn entry_error(entry: &str, why: impl Into<String>) -> Refusal {
    Refusal::Entry {
        entry: entry.to_owned(),
        why: why.into(),
    }
}

/// Vets the model archive at `path` before it is handed to libtorch or Python; the error
/// names the file and what is wrong in it.
pub fn vet_file(path: &Path) -> Result<ArchiveKind, TrainError> {
    let refused = |refusal: Refusal| TrainError::Refused {
        path: path.to_owned(),
        reason: refusal.to_string(),
    };
    let file = ZipFile::open(path).map_err(|e| TrainError::File {
        path: path.to_owned(),
        message: e.to_string(),
    })?;
    // No zip reader finds an archive in a file without an end-of-central-directory record, and
    // libtorch's and PyTorch's loaders read zip archives only: such a file loads no code, and
    // its loader's own error says best what it is.
    if !file.has_zip_end() {
        return Ok(ArchiveKind::Other);
    }
    vet_reader(file, 0, "").map_err(refused)
}

/// Vets an archive held in memory: what [`vet_file`] does, for any bytes (never panics).
pub fn vet_bytes(bytes: &[u8]) -> Result<ArchiveKind, Refusal> {
    vet_reader(Cursor::new(bytes), 0, "")
}

/// Vets the archive `reader` at nesting `depth` (0: the file itself); `outer` names the entry
/// that holds it. A panic of the zip reader on hostile bytes becomes a refusal.
fn vet_reader<R: Read + Seek>(
    reader: R,
    depth: usize,
    outer: &str,
) -> Result<ArchiveKind, Refusal> {
    let run = std::panic::AssertUnwindSafe(|| vet_zip(reader, depth, outer));
    std::panic::catch_unwind(run).unwrap_or_else(|_| {
        Err(Refusal::NotAnArchive(
            "the zip reader failed on it".to_owned(),
        ))
    })
}

/// One entry's name and declared sizes.
struct Entry {
    name: String,
    label: String,
    size: u64,
}

fn vet_zip<R: Read + Seek>(reader: R, depth: usize, outer: &str) -> Result<ArchiveKind, Refusal> {
    let mut zip = zip::ZipArchive::new(reader).map_err(|e| Refusal::NotAnArchive(e.to_string()))?;
    if zip.len() > MAX_ENTRIES {
        return Err(Refusal::NotAnArchive(format!(
            "{} entries, more than the {MAX_ENTRIES} kiln reads",
            zip.len()
        )));
    }
    let entries = list(&mut zip, outer)?;
    let kind = kind_of(&entries);
    let pickled = match kind {
        ArchiveKind::ExportedProgram => program_payloads(&mut zip, &entries)?,
        _ => BTreeSet::new(),
    };
    for (index, entry) in entries.iter().enumerate() {
        vet_entry(&mut zip, index, entry, kind, &pickled, depth)?;
    }
    Ok(kind)
}

/// Every entry's name and size, each checked: a plain relative path, unique, stored or
/// deflated, a size it can have, no native library by its name.
fn list<R: Read + Seek>(zip: &mut zip::ZipArchive<R>, outer: &str) -> Result<Vec<Entry>, Refusal> {
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(zip.len());
    for index in 0..zip.len() {
        let file = zip
            .by_index_raw(index)
            .map_err(|e| Refusal::NotAnArchive(e.to_string()))?;
        let name = file.name().to_owned();
        let label = if outer.is_empty() {
            name.clone()
        } else {
            format!("{outer}!/{name}")
        };
        check_name(&name).map_err(|why| entry_error(&label, why))?;
        if !seen.insert(name.clone()) {
            return Err(entry_error(&label, "appears twice in the archive"));
        }
        check_size(&file, &label)?;
        if let Some(what) = native_by_name(&name) {
            return Err(Refusal::NativeCode { entry: label, what });
        }
        out.push(Entry {
            name,
            label,
            size: file.size(),
        });
    }
    Ok(out)
}

/// What is wrong with an entry's name, if anything: it must be a relative path of plain parts.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.contains('\0') || name.contains('\\') {
        return Err("has an empty name, a NUL or a backslash in it");
    }
    if name.starts_with('/') || name.split('/').next().is_some_and(|p| p.contains(':')) {
        return Err("is an absolute path");
    }
    if name.split('/').any(|part| part == ".." || part == ".") {
        return Err("climbs out of the archive's directory (`..` or `.` in its path)");
    }
    Ok(())
}

/// Refuses compression PyTorch's reader does not read, encryption, and sizes no entry has.
fn check_size(file: &zip::read::ZipFile<'_>, label: &str) -> Result<(), Refusal> {
    let (size, packed) = (file.size(), file.compressed_size());
    match file.compression() {
        zip::CompressionMethod::Stored if size != packed => Err(entry_error(
            label,
            format!("is stored uncompressed, yet declares {size} bytes from {packed}"),
        )),
        zip::CompressionMethod::Stored => Ok(()),
        zip::CompressionMethod::Deflated
            if size > packed.saturating_mul(MAX_DEFLATE_RATIO) + 1024 =>
        {
            Err(entry_error(
                label,
                format!(
                    "declares {size} bytes from {packed} compressed, more than deflate can \
                     expand to (a zip bomb, or a forged size)"
                ),
            ))
        }
        zip::CompressionMethod::Deflated => Ok(()),
        other => Err(entry_error(
            label,
            format!("is compressed with {other:?}, which PyTorch's reader does not read"),
        )),
    }
}

/// Native code by an entry's name: a shared library, or an AOTInductor package's directory.
fn native_by_name(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    if lower.contains("/aotinductor/") || lower.starts_with("aotinductor/") {
        return Some("an AOTInductor package");
    }
    [".so", ".dll", ".dylib", ".pyd", ".bundle"]
        .iter()
        .any(|ext| lower.ends_with(ext) || lower.contains(&format!("{ext}.")))
        .then_some("a shared library")
}

/// Native code by an entry's first bytes: ELF, Mach-O.
fn native_by_magic(head: &[u8]) -> Option<&'static str> {
    match head {
        [0x7f, b'E', b'L', b'F', ..] => Some("an ELF executable or library"),
        [0xfe, 0xed, 0xfa, 0xce | 0xcf, ..] | [0xce | 0xcf, 0xfa, 0xed, 0xfe, ..] => {
            Some("a Mach-O executable or library")
        }
        _ => None,
    }
}

fn kind_of(entries: &[Entry]) -> ArchiveKind {
    let has = |suffix: &str| entries.iter().any(|e| e.name.ends_with(suffix));
    let under = |part: &str| entries.iter().any(|e| e.name.contains(part));
    if has("/archive_format") && under("/models/") {
        ArchiveKind::ExportedProgram
    } else if has("/data.pkl") && under("/code/") {
        ArchiveKind::TorchScript
    } else {
        ArchiveKind::Other
    }
}

/// Whether a name is a tensor's raw storage (read as bytes, never parsed).
fn raw_tensor_data(name: &str) -> bool {
    let last = name.rsplit('/').next().unwrap_or(name);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let parent = name.rsplit('/').nth(1).unwrap_or("");
    ((parent == "data" || parent == "constants") && digits(last))
        || last.strip_prefix("weight_").is_some_and(digits)
        || last.strip_prefix("tensor_").is_some_and(digits)
}

/// Reads entry `index` whole, refusing more than `limit` bytes.
fn read_entry<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    index: usize,
    entry: &Entry,
    limit: u64,
) -> Result<Vec<u8>, Refusal> {
    if entry.size > limit {
        return Err(entry_error(
            &entry.label,
            format!(
                "is {} bytes, more than the {limit} kiln reads of it",
                entry.size
            ),
        ));
    }
    let file = zip
        .by_index(index)
        .map_err(|e| entry_error(&entry.label, e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| entry_error(&entry.label, format!("cannot be read: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(entry_error(
            &entry.label,
            "is larger than its declared size",
        ));
    }
    Ok(bytes)
}

/// The first bytes of entry `index`.
fn head_of<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    index: usize,
    label: &str,
) -> Result<Vec<u8>, Refusal> {
    let file = zip
        .by_index(index)
        .map_err(|e| entry_error(label, e.to_string()))?;
    let mut head = Vec::with_capacity(4);
    file.take(4)
        .read_to_end(&mut head)
        .map_err(|e| entry_error(label, format!("cannot be read: {e}")))?;
    Ok(head)
}

/// Vets one entry by what loading the archive does with it.
fn vet_entry<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    index: usize,
    entry: &Entry,
    kind: ArchiveKind,
    pickled: &BTreeSet<String>,
    depth: usize,
) -> Result<(), Refusal> {
    let name = entry.name.as_str();
    if name.ends_with(".pkl") || name.ends_with(".debug_pkl") {
        let bytes = read_entry(zip, index, entry, MAX_SCANNED)?;
        let allowed = match kind {
            ArchiveKind::TorchScript => script_global,
            _ => tensor_global,
        };
        return pickle::scan(&bytes, &allowed).map_err(|source| Refusal::Pickle {
            entry: entry.label.clone(),
            source,
        });
    }
    if kind == ArchiveKind::ExportedProgram && name.ends_with(".json") {
        let bytes = read_entry(zip, index, entry, MAX_SCANNED)?;
        return vet_program_json(&bytes, &entry.label);
    }
    let unpickled = pickled.contains(name);
    if raw_tensor_data(name) && !unpickled || entry.size == 0 || name.ends_with('/') {
        return Ok(());
    }
    let head = head_of(zip, index, &entry.label)?;
    if let Some(what) = native_by_magic(&head) {
        return Err(Refusal::NativeCode {
            entry: entry.label.clone(),
            what,
        });
    }
    if head.starts_with(b"PK\x03\x04") {
        return vet_nested(zip, index, entry, depth);
    }
    if unpickled {
        return Err(entry_error(
            &entry.label,
            "is loaded with torch.load but is no torch.save archive (a bare pickle, which kiln \
             does not load)",
        ));
    }
    Ok(())
}

/// A `torch.save` archive inside the archive (a program's sample inputs): vetted the same way,
/// its pickles held to the tensor types; no archive deeper than that.
fn vet_nested<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    index: usize,
    entry: &Entry,
    depth: usize,
) -> Result<(), Refusal> {
    if depth >= 1 {
        return Err(entry_error(&entry.label, "is an archive nested too deep"));
    }
    let bytes = read_entry(zip, index, entry, MAX_NESTED)?;
    match vet_reader(Cursor::new(bytes), depth + 1, &entry.label)? {
        ArchiveKind::Other => Ok(()),
        kind => Err(entry_error(
            &entry.label,
            format!("holds a nested {kind:?} archive, which no model file holds"),
        )),
    }
}

/// The entries a program's loader unpickles with `torch.load`: its sample inputs, legacy
/// weight and constant files, and the payloads its weights and constants configs mark
/// `use_pickle`. A pickled TorchScript object (`custom_obj_…`) is refused here.
fn program_payloads<R: Read + Seek>(
    zip: &mut zip::ZipArchive<R>,
    entries: &[Entry],
) -> Result<BTreeSet<String>, Refusal> {
    let mut out = BTreeSet::new();
    for (index, entry) in entries.iter().enumerate() {
        let name = entry.name.as_str();
        let dir = name.rsplit_once('/').map_or("", |(d, _)| d);
        let legacy = (dir.ends_with("data/weights") || dir.ends_with("data/constants"))
            && name.ends_with(".pt");
        if dir.ends_with("data/sample_inputs") || legacy {
            out.insert(name.to_owned());
        }
        if name.ends_with("_weights_config.json") || name.ends_with("_constants_config.json") {
            let bytes = read_entry(zip, index, entry, MAX_SCANNED)?;
            for payload in pickled_payloads(&bytes, &entry.label)? {
                out.insert(format!("{dir}/{payload}"));
            }
        }
    }
    Ok(out)
}

/// The `path_name`s a weights or constants config marks `use_pickle`.
fn pickled_payloads(json: &[u8], label: &str) -> Result<Vec<String>, Refusal> {
    let value: Value = serde_json::from_slice(json)
        .map_err(|e| entry_error(label, format!("is not valid JSON ({e})")))?;
    let mut out = vec![];
    let Some(config) = value.get("config").and_then(Value::as_object) else {
        return Ok(out);
    };
    for (fqn, payload) in config {
        let path = payload
            .get("path_name")
            .and_then(Value::as_str)
            .unwrap_or("");
        if path.starts_with("custom_obj") {
            return Err(entry_error(
                label,
                format!(
                    "`{fqn}` is a pickled TorchScript object ({path}), which kiln does not load"
                ),
            ));
        }
        if path.contains('/') || path.contains("..") {
            return Err(entry_error(
                label,
                format!("`{fqn}` points outside its directory"),
            ));
        }
        if payload.get("use_pickle").and_then(Value::as_bool) == Some(true) {
            out.push(path.to_owned());
        }
    }
    Ok(out)
}

/// A program's JSON: valid, and every symbolic expression (`expr_str`) of the safe grammar.
fn vet_program_json(json: &[u8], label: &str) -> Result<(), Refusal> {
    let value: Value = serde_json::from_slice(json)
        .map_err(|e| entry_error(label, format!("is not valid JSON ({e})")))?;
    let mut pending = vec![&value];
    while let Some(v) = pending.pop() {
        match v {
            Value::Array(items) => pending.extend(items),
            Value::Object(map) => {
                for (key, item) in map {
                    if let (true, Value::String(expr)) = (key == "expr_str", item) {
                        check_expression(expr).map_err(|why| Refusal::Expression {
                            entry: label.to_owned(),
                            expr: expr.chars().take(200).collect(),
                            why,
                        })?;
                    }
                    pending.push(item);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The functions and constants a shape expression may name: sympy's (as `srepr` writes them)
/// and those of `torch.utils._sympy.functions` the deserializer passes to `sympify`.
const EXPRESSION_NAMES: &[&str] = &[
    "Symbol",
    "Integer",
    "Rational",
    "Float",
    "Add",
    "Mul",
    "Pow",
    "Mod",
    "Max",
    "Min",
    "Abs",
    "floor",
    "ceiling",
    "Eq",
    "Ne",
    "Lt",
    "Le",
    "Gt",
    "Ge",
    "StrictLessThan",
    "StrictGreaterThan",
    "LessThan",
    "GreaterThan",
    "Equality",
    "Unequality",
    "And",
    "Or",
    "Not",
    "Piecewise",
    "ExprCondPair",
    "Tuple",
    "True",
    "False",
    "None",
    "oo",
    "zoo",
    "nan",
    "Half",
    "One",
    "Zero",
    "NegativeOne",
    "Infinity",
    "NegativeInfinity",
    "ComplexInfinity",
    "NaN",
    "BooleanTrue",
    "BooleanFalse",
    "FloorDiv",
    "ModularIndexing",
    "Where",
    "PythonMod",
    "CleanDiv",
    "CeilToInt",
    "FloorToInt",
    "CeilDiv",
    "LShift",
    "RShift",
    "PowByNatural",
    "FloatPow",
    "FloatTrueDiv",
    "IntTrueDiv",
    "IsNonOverlappingAndDenseIndicator",
    "TruncToFloat",
    "TruncToInt",
    "RoundToInt",
    "RoundDecimal",
    "ToFloat",
    "Identity",
];

/// Whether `name` is a shape symbol (`s0`, `u3`, `s77`): lower-case letters, then digits.
fn symbol_like(name: &str) -> bool {
    let letters = name.bytes().take_while(u8::is_ascii_lowercase).count();
    letters > 0 && letters < name.len() && name.bytes().skip(letters).all(|b| b.is_ascii_digit())
}

/// Checks a symbolic expression against the grammar of what `torch.export` writes: names of
/// [`EXPRESSION_NAMES`], shape symbols, keyword arguments, numbers, quoted symbol names or
/// numbers, operators and brackets; nothing that reaches Python's builtins or attributes.
pub fn check_expression(expr: &str) -> Result<(), String> {
    if expr.len() > MAX_EXPRESSION {
        return Err(format!("longer than {MAX_EXPRESSION} characters"));
    }
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let token_end = match b {
            b' ' | b'\t' | b'\n' => i + 1,
            b'0'..=b'9' => {
                i + bytes[i..]
                    .iter()
                    .take_while(|c| c.is_ascii_digit() || matches!(c, b'.' | b'e' | b'E'))
                    .count()
            }
            b'\'' | b'"' => quoted_end(bytes, i)?,
            b'A'..=b'Z' | b'a'..=b'z' | b'_' => identifier_end(bytes, i)?,
            b'+' | b'-' | b'*' | b'/' | b'%' | b'(' | b')' | b',' | b'<' | b'>' | b'=' | b'!'
            | b'&' | b'|' | b'~' | b'^' => i + 1,
            other => return Err(format!("the character `{}`", char::from(other))),
        };
        i = token_end;
    }
    Ok(())
}

/// The end of the quoted string starting at `start`: a symbol's name or a number.
fn quoted_end(bytes: &[u8], start: usize) -> Result<usize, String> {
    let quote = bytes[start];
    let len = bytes[start + 1..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'+' | b'-'))
        .count();
    match bytes.get(start + 1 + len) {
        Some(&q) if q == quote => Ok(start + len + 2),
        _ => Err("a quoted text other than a name or a number".to_owned()),
    }
}

/// The end of the identifier starting at `start`, if it is one an expression may hold.
fn identifier_end(bytes: &[u8], start: usize) -> Result<usize, String> {
    let len = bytes[start..]
        .iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count();
    let end = start + len;
    let name = String::from_utf8_lossy(&bytes[start..end]);
    let keyword = bytes.get(end) == Some(&b'=') && bytes.get(end + 1) != Some(&b'=');
    let lower = name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_');
    let known = EXPRESSION_NAMES.contains(&name.as_ref())
        || ["OpaqueUnaryFn_", "BitwiseFn_"].iter().any(|p| {
            name.strip_prefix(p)
                .is_some_and(|r| r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
        });
    if known || symbol_like(&name) || keyword && lower && !name.starts_with('_') {
        Ok(end)
    } else {
        Err(format!("the name `{name}`"))
    }
}

/// The globals a pickle of tensors may import: `torch.save`'s rebuild functions, storage
/// types, dtypes and devices, and `collections.OrderedDict`.
pub fn tensor_global(module: &str, name: &str) -> bool {
    const REBUILD: &[&str] = &[
        "_rebuild_tensor",
        "_rebuild_tensor_v2",
        "_rebuild_tensor_v3",
        "_rebuild_parameter",
        "_rebuild_parameter_with_state",
        "_rebuild_qtensor",
        "_rebuild_sparse_tensor",
        "_rebuild_meta_tensor_no_storage",
    ];
    const TORCH: &[&str] = &[
        "Size",
        "device",
        "float32",
        "float64",
        "float16",
        "bfloat16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        "float",
        "double",
        "half",
        "long",
        "int",
        "short",
    ];
    let storage = |n: &str| {
        n.strip_suffix("Storage")
            .is_some_and(|s| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    };
    match module {
        "collections" => name == "OrderedDict",
        "torch" => storage(name) || TORCH.contains(&name),
        "torch._utils" => REBUILD.contains(&name),
        _ => false,
    }
}

/// The globals a TorchScript archive's pickles may import besides [`tensor_global`]'s: its own
/// classes (`__torch__.…`, compiled from the archive's TorchScript code, never Python) and
/// `torch.jit._pickle`'s list builders.
pub fn script_global(module: &str, name: &str) -> bool {
    const JIT: &[&str] = &[
        "build_intlist",
        "build_tensorlist",
        "build_doublelist",
        "build_boollist",
        "build_tensor_from_id",
        "restore_type_tag",
    ];
    let plain = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let own_class = (module == "__torch__" || module.starts_with("__torch__."))
        && module.split('.').all(plain)
        && plain(name);
    tensor_global(module, name) || own_class || module == "torch.jit._pickle" && JIT.contains(&name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expressions_torch_export_writes_pass() {
        for expr in [
            "Symbol('s77', positive=True, integer=True)",
            "Add(Mul(Integer(3), Symbol('s77', positive=True, integer=True)), \
             FloorDiv(Mul(Integer(3), Symbol('s77', positive=True, integer=True)), Integer(2)))",
            "Max(Integer(2), Symbol('s77', positive=True, integer=True))",
            "Mod(Symbol('s0', integer=True), Integer(-3))",
            "Float('1.5e-3', precision=53)",
            "s0*2 + FloorDiv(s1, 4) >= 1",
            "OpaqueUnaryFn_sqrt(s0)",
        ] {
            assert_eq!(check_expression(expr), Ok(()), "{expr}");
        }
    }

    #[test]
    fn expressions_that_reach_python_are_refused() {
        for (expr, why) in [
            ("__import__('os').system('id')", "`__import__`"),
            ("eval('1')", "`eval`"),
            ("Symbol('x').__class__", "`.`"),
            ("Symbol(\"a b\")", "quoted"),
            ("getattr(Integer(1), 'x')", "`getattr`"),
            ("[s0 for s0 in Tuple()]", "`[`"),
            ("lambda: 1", "`lambda`"),
            ("1else 0", "`lse`"),
            ("Symbol('x'); 1", "`;`"),
            ("Integer(1)\\", "`\\`"),
        ] {
            let e = check_expression(expr).unwrap_err();
            assert!(e.contains(why), "{expr}: {e}");
        }
    }

    #[test]
    fn names_that_leave_the_archive_are_refused() {
        for name in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "C:/x",
            "a\\b",
            "a/./b",
            "",
        ] {
            assert!(check_name(name).is_err(), "{name}");
        }
        assert!(check_name("model/data/0").is_ok());
        assert!(check_name("m/code/__torch__/a.py").is_ok());
    }

    #[test]
    fn the_allow_lists_hold_pytorchs_types_only() {
        assert!(tensor_global("torch._utils", "_rebuild_tensor_v2"));
        assert!(tensor_global("torch", "BFloat16Storage"));
        assert!(tensor_global("collections", "OrderedDict"));
        assert!(!tensor_global("torch", "load"));
        assert!(!tensor_global(
            "torch._utils",
            "_rebuild_tensor_v2.__globals__"
        ));
        assert!(!tensor_global("os", "system"));
        assert!(!tensor_global("__torch__", "M"));
        assert!(script_global("__torch__.torch.nn.modules.linear", "Linear"));
        assert!(script_global("torch.jit._pickle", "build_intlist"));
        assert!(!script_global("__torch__.x y", "M"));
        assert!(!script_global("builtins", "eval"));
    }

    #[test]
    fn raw_tensor_entries_are_told_by_their_names() {
        assert!(raw_tensor_data("script/data/12"));
        assert!(raw_tensor_data("traced/constants/0"));
        assert!(raw_tensor_data("prog/data/weights/weight_3"));
        assert!(raw_tensor_data("dict/data/constants/tensor_0"));
        assert!(!raw_tensor_data("prog/data/sample_inputs/model.pt"));
        assert!(!raw_tensor_data("script/data.pkl"));
    }

    #[test]
    fn garbage_is_refused_not_panicked_on() {
        for bytes in [
            &b""[..],
            b"PK\x03\x04",
            b"PK\x05\x06\0\0\0\0\xff\xff\xff\xff",
            b"\0\0\0",
        ] {
            assert!(vet_bytes(bytes).is_err(), "{bytes:?}");
        }
    }

    #[test]
    fn a_file_no_zip_reader_would_open_passes_to_its_loader() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.pt");
        std::fs::write(&plain, b"not a model at all").unwrap();
        assert_eq!(vet_file(&plain).unwrap(), ArchiveKind::Other);
        // With an end-of-central-directory record, an archive kiln cannot read is refused.
        let broken = dir.path().join("broken.pt");
        std::fs::write(&broken, b"junk PK\x05\x06\0\0\0\0\xff\xff\xff\xff").unwrap();
        assert!(matches!(vet_file(&broken), Err(TrainError::Refused { .. })));
    }
}
