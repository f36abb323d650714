//! Tidy tests: each architecture invariant of docs/ARCHITECTURE.md, checked over the repository's
//! files (std only, like xtask itself), so a change that breaks one fails `cargo test`.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file under `dir` (recursively) whose name ends with one of `exts`, skipping build
/// output, VCS and caches.
fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !name.starts_with('.') && !["target", "runs", "__pycache__"].contains(&name.as_str())
            {
                out.extend(files(&p, exts));
            }
        } else if exts.iter().any(|x| name.ends_with(x)) {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// The `kiln-*` packages a manifest's `[dependencies]` and `[dev-dependencies]` name.
fn kiln_deps(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let mut section = String::new();
    let mut deps = vec![];
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_owned();
        } else if (section == "[dependencies]" || section == "[dev-dependencies]")
            && line.starts_with("kiln-")
        {
            let name = line.split(['.', ' ', '=']).next().unwrap().to_owned();
            if !deps.contains(&name) {
                deps.push(name);
            }
        }
    }
    deps.sort();
    deps
}

/// Every library crate: what the CLI and the benchmarks, at the top, may use.
const ALL_LIBRARIES: &[&str] = &[
    "kiln-config",
    "kiln-core",
    "kiln-data",
    "kiln-device",
    "kiln-infer",
    "kiln-profiles",
    "kiln-torch-ext",
    "kiln-train",
];

/// Which kiln crates each crate may use (docs/ARCHITECTURE.md, "Crates").
const LAYERS: &[(&str, &[&str])] = &[
    ("crates/core", &[]),
    ("crates/torch-ext", &["kiln-core"]),
    ("crates/device", &["kiln-core", "kiln-torch-ext"]),
    ("crates/profiles", &["kiln-core"]),
    ("crates/config", &["kiln-core", "kiln-profiles"]),
    ("crates/data", &[]),
    (
        "crates/train",
        &[
            "kiln-config",
            "kiln-core",
            "kiln-data",
            "kiln-device",
            "kiln-profiles",
            "kiln-torch-ext",
        ],
    ),
    (
        "crates/infer",
        &[
            "kiln-config",
            "kiln-core",
            "kiln-data",
            "kiln-device",
            "kiln-profiles",
            "kiln-torch-ext",
            "kiln-train",
        ],
    ),
    ("crates/cli", ALL_LIBRARIES),
    ("benches", ALL_LIBRARIES),
    ("examples", &["kiln-train"]),
    (
        "fuzz",
        &[
            "kiln-config",
            "kiln-core",
            "kiln-data",
            "kiln-infer",
            "kiln-profiles",
            "kiln-train",
        ],
    ),
    ("soak", &["kiln-benches", "kiln-data"]),
    ("xtask", &[]),
];

#[test]
fn crates_use_only_the_crates_below_them() {
    let root = root();
    for manifest in files(&root.join("crates"), &["Cargo.toml"]) {
        let dir = manifest.parent().unwrap().strip_prefix(&root).unwrap();
        assert!(
            LAYERS.iter().any(|(d, _)| Path::new(d) == dir),
            "{} is not in the layering table: add it here and to docs/ARCHITECTURE.md",
            dir.display()
        );
    }
    for (dir, allowed) in LAYERS {
        let deps = kiln_deps(&root.join(dir).join("Cargo.toml"));
        let extra: Vec<&String> = deps
            .iter()
            .filter(|d| !allowed.contains(&d.as_str()))
            .collect();
        assert!(
            extra.is_empty(),
            "{dir} uses {extra:?}, above it or beside it in the layering"
        );
    }
}

/// The train crate's modules in layers, from the bottom (docs/ARCHITECTURE.md, "`crates/train`"):
/// a module uses modules of its own layer or below, never above.
const TRAIN_LAYERS: &[(&str, &[&str])] = &[
    (
        "foundation",
        &[
            "ema",
            "error",
            "fault",
            "feed",
            "init",
            "inputs",
            "metrics",
            "monitor",
            "optim",
            "plot",
            "profiling",
            "python",
            "record",
            "rundir",
            "scaler",
            "schedule",
            "stopping",
            "tensorboard",
            "weights",
            "workers",
        ],
    ),
    ("the model contract", &["model", "model_summary"]),
    (
        "losses and the ranks' collectives",
        &["distributed", "loss"],
    ),
    ("model sources", &["models", "program", "script", "source"]),
    ("checkpoints", &["checkpoint"]),
    ("the step and the fit loop", &["stepper", "trainer"]),
    ("the run", &["batch_search", "learner", "lr_find", "run"]),
];

/// A source file's text without comments (line comments and doc lines), up to its unit tests.
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    text.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names right after each `prefix` in `code` (`prefix::{a, b::c}` gives `a` and `b`).
fn heads_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let head = |t: &'a str| {
        let t = t.trim_start();
        &t[..t
            .find(|c: char| !c.is_alphanumeric() && c != '_')
            .unwrap_or(t.len())]
    };
    let mut heads = vec![];
    for piece in code.split(prefix).skip(1) {
        match piece.strip_prefix('{') {
            Some(g) => heads.extend(g.split('}').next().unwrap_or_default().split(',').map(head)),
            None => heads.push(head(piece)),
        }
    }
    heads.retain(|h| !h.is_empty());
    heads
}

/// The top-level modules of the crate at `src` that each top-level module names through
/// `crate::` (in `use` lines, `use crate::{…}` groups and paths), itself excluded.
fn module_imports(src: &Path) -> Vec<(String, Vec<String>)> {
    let module_of = |p: &Path| {
        let rel = p.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        first.trim_end_matches(".rs").to_owned()
    };
    let all: Vec<PathBuf> = files(src, &[".rs"]);
    let names: Vec<String> = all.iter().map(|p| module_of(p)).collect();
    let mut out: Vec<(String, Vec<String>)> = vec![];
    for (path, module) in all.iter().zip(&names) {
        let code = code_of(path);
        let mut used = vec![];
        for head in heads_after(&code, "crate::") {
            if head != module && names.iter().any(|n| n == head) {
                used.push(head.to_owned());
            }
        }
        match out.iter_mut().find(|(m, _)| m == module) {
            Some((_, u)) => u.extend(used),
            None => out.push((module.clone(), used)),
        }
    }
    for (_, used) in &mut out {
        used.sort();
        used.dedup();
    }
    out
}

#[test]
fn train_modules_use_only_their_layer_and_below_and_form_no_circle() {
    let src = root().join("crates/train/src");
    let layer_of = |m: &str| TRAIN_LAYERS.iter().position(|(_, ms)| ms.contains(&m));
    let imports = module_imports(&src);
    for (module, used) in &imports {
        if module == "lib" {
            continue;
        }
        let Some(own) = layer_of(module) else {
            panic!(
                "crates/train/src/{module} is in no layer: add it to TRAIN_LAYERS and docs/ARCHITECTURE.md"
            );
        };
        for u in used {
            let theirs = layer_of(u).unwrap_or(usize::MAX);
            assert!(
                theirs <= own,
                "train's `{module}` ({}) uses `{u}` ({}), a layer above it",
                TRAIN_LAYERS[own].0,
                TRAIN_LAYERS.get(theirs).map_or("no layer", |l| l.0)
            );
        }
    }
    // No circle within a layer either.
    assert_no_circle("crates/train", &imports);
}

/// The modules of `kiln_train` the benchmarks may name (docs/ARCHITECTURE.md, "Public library
/// API"): the building blocks, never the run's own machinery (`trainer`, `feed`, `run`, …).
const PUBLIC_TRAIN_MODULES: &[&str] = &[
    "prelude",
    "model",
    "models",
    "source",
    "script",
    "program",
    "loss",
    "optim",
    "stepper",
    "metrics",
    "record",
    "learner",
    "plot",
    "workers",
    "TrainError",
];

/// The benchmarks drive kiln through its public library API, so a change inside the trainer
/// never breaks them.
#[test]
fn benches_use_only_the_public_train_modules() {
    let root = root();
    let mut found = vec![];
    for file in files(&root.join("benches"), &["rs"]) {
        for name in heads_after(&code_of(&file), "kiln_train::") {
            if !PUBLIC_TRAIN_MODULES.contains(&name) {
                found.push(format!("{}: kiln_train::{name}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "benches name kiln_train's internals (use the Learner, the Stepper or a module \
         docs/ARCHITECTURE.md lists as public): {found:#?}"
    );
}

/// Every crate's modules import each other without a circle, but config's key table: its
/// macro (`setting`) writes the raw sections (`raw`), the key constants (`keys`) and the plan's
/// assembly (`plan`), which name each other by design.
#[test]
fn no_crate_imports_its_own_modules_in_a_circle() {
    let crates = root().join("crates");
    for dir in std::fs::read_dir(&crates).unwrap().flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        if name == "config" || !dir.path().join("src").is_dir() {
            continue;
        }
        let imports = module_imports(&dir.path().join("src"));
        assert_no_circle(&format!("crates/{name}"), &imports);
    }
}

/// Whether `from` reaches `to` through the imports (depth first).
fn reaches(
    imports: &[(String, Vec<String>)],
    from: &str,
    to: &str,
    seen: &mut Vec<String>,
) -> bool {
    let used = imports
        .iter()
        .find(|(m, _)| m == from)
        .map(|(_, u)| u.as_slice())
        .unwrap_or(&[]);
    used.iter().any(|u| {
        u == to
            || (!seen.contains(u) && {
                seen.push(u.clone());
                reaches(imports, u, to, seen)
            })
    })
}

/// Fails when a module of `krate` reaches itself through its imports.
fn assert_no_circle(krate: &str, imports: &[(String, Vec<String>)]) {
    for (module, _) in imports.iter().filter(|(m, _)| m != "lib" && m != "main") {
        assert!(
            !reaches(imports, module, module, &mut vec![]),
            "{krate}: `{module}` imports itself through a circle of modules"
        );
    }
}

#[test]
fn only_torch_ext_contains_cpp() {
    let root = root();
    let cpp = files(&root, &[".cpp", ".cc", ".cxx", ".h", ".hpp", ".cu"]);
    let outside: Vec<&PathBuf> = cpp
        .iter()
        .filter(|p| !p.starts_with(root.join("crates/torch-ext/csrc")))
        .collect();
    assert!(
        outside.is_empty(),
        "C++ outside crates/torch-ext/csrc: {outside:?}"
    );
    assert!(
        !cpp.is_empty(),
        "the native extension's sources were not found"
    );
}

/// Lines of library source (before any `#[cfg(test)]`) of the crates under `crates/`, except
/// `exclude`.
fn library_lines(exclude: &[&str]) -> Vec<(PathBuf, usize, String)> {
    let root = root();
    let mut out = vec![];
    for f in files(&root.join("crates"), &[".rs"]) {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if !rel.contains("/src/") || exclude.iter().any(|e| rel.starts_with(e)) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("#[cfg(test)]") {
                break;
            }
            out.push((f.clone(), i + 1, line.to_owned()));
        }
    }
    out
}

#[test]
fn only_device_talks_to_nvml() {
    let hits: Vec<_> = library_lines(&["crates/device/"])
        .into_iter()
        .filter(|(_, _, l)| l.contains("nvml_wrapper"))
        .collect();
    assert!(hits.is_empty(), "NVML used outside crates/device: {hits:?}");
    let root = root();
    for (dir, _) in LAYERS.iter().filter(|(d, _)| *d != "crates/device") {
        let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
        assert!(
            !text.contains("nvml-wrapper"),
            "{dir} depends on nvml-wrapper"
        );
    }
}

/// Whether `line` names the `ort` crate's paths (`ort::…`, not `report::…`).
fn names_ort(line: &str) -> bool {
    line.match_indices("ort::").any(|(i, _)| {
        !line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn only_infer_talks_to_onnx_runtime_and_never_through_its_panicking_loader() {
    let hits: Vec<_> = library_lines(&["crates/infer/"])
        .into_iter()
        .filter(|(_, _, l)| names_ort(l))
        .collect();
    assert!(
        hits.is_empty(),
        "ONNX Runtime used outside crates/infer: {hits:?}"
    );
    let root = root();
    for (dir, _) in LAYERS.iter().filter(|(d, _)| *d != "crates/infer") {
        let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
        assert!(
            !text.lines().any(|l| l.trim_start().starts_with("ort")),
            "{dir} depends on ort"
        );
    }
    // ort::init() looks for the library itself and panics where it is missing; kiln loads it
    // with ort::init_from, which returns the error.
    let panicking: Vec<_> = library_lines(&[])
        .into_iter()
        .filter(|(_, _, l)| l.contains("ort::init()") || l.contains("ort::api()"))
        .collect();
    assert!(panicking.is_empty(), "{panicking:?}");
}

#[test]
fn only_the_cli_uses_anyhow_and_xtask_has_no_dependencies() {
    let root = root();
    for (dir, _) in LAYERS.iter().filter(|(d, _)| *d != "crates/cli") {
        let text = std::fs::read_to_string(root.join(dir).join("Cargo.toml")).unwrap();
        let deps = text
            .split("[dependencies]")
            .nth(1)
            .unwrap_or("")
            .split("\n[")
            .next()
            .unwrap();
        assert!(
            !deps.contains("anyhow"),
            "{dir} depends on anyhow (library code uses error enums)"
        );
    }
    let xtask = std::fs::read_to_string(root.join("xtask/Cargo.toml")).unwrap();
    let deps = xtask
        .split("[dependencies]")
        .nth(1)
        .unwrap_or("")
        .split("\n[")
        .next()
        .unwrap();
    assert!(deps.trim().is_empty(), "xtask has dependencies: {deps}");
}

/// Library code returns errors: no unwrap/expect/panic outside tests (and the CLI binary),
/// except the lines listed with their reason.
#[test]
fn library_code_does_not_panic() {
    const ALLOWED: &[(&str, &str)] = &[(
        "crates/torch-ext/src/flags.rs",
        "expect(\"precision names have no NUL\")",
    )];
    let root = root();
    let hits: Vec<String> = library_lines(&["crates/cli/"])
        .into_iter()
        .filter(|(_, _, l)| {
            let code = l.split("//").next().unwrap();
            [
                ".unwrap()",
                ".expect(",
                "panic!(",
                "todo!(",
                "unimplemented!(",
            ]
            .iter()
            .any(|p| code.contains(p))
        })
        .filter(|(f, _, l)| {
            let rel = f
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            !ALLOWED
                .iter()
                .any(|(file, text)| rel == *file && l.contains(text))
        })
        .map(|(f, n, l)| format!("{}:{n}: {}", f.display(), l.trim()))
        .collect();
    assert!(
        hits.is_empty(),
        "library code that can panic:\n{}",
        hits.join("\n")
    );
}

#[test]
fn every_rust_file_starts_with_a_doc_line() {
    let root = root();
    let mut missing = vec![];
    for dir in ["crates", "benches", "xtask", "examples", "fuzz", "soak"] {
        for f in files(&root.join(dir), &[".rs"]) {
            let text = std::fs::read_to_string(&f).unwrap();
            if !text.starts_with("//!") {
                missing.push(f);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files without a leading //! line: {missing:?}"
    );
}

/// The rows of the markdown table in `doc` whose header row starts with `header`: each row's
/// cells, trimmed.
fn doc_table(doc: &str, header: &str) -> Vec<Vec<String>> {
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(header));
    assert!(
        lines.next().is_some(),
        "docs/ARCHITECTURE.md has no table `{header}`"
    );
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The names in backticks in a table cell (`a`, `b`), sorted.
fn ticked(cell: &str) -> Vec<String> {
    let mut names: Vec<String> = cell
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

/// What docs/ARCHITECTURE.md says about layering is what the tidy tests hold: its crate table
/// is `LAYERS`, its table of train's layers is `TRAIN_LAYERS`, row for row.
#[test]
fn the_architecture_doc_states_the_layering_the_tidy_tests_hold() {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let crates = doc_table(&doc, "| crate | uses |");
    let dirs: Vec<String> = crates.iter().map(|r| ticked(&r[0]).concat()).collect();
    let expected: Vec<&str> = LAYERS.iter().map(|(d, _)| *d).collect();
    assert_eq!(dirs, expected, "the doc's crate table, in LAYERS' order");
    for (row, (dir, uses)) in crates.iter().zip(LAYERS) {
        let mut uses: Vec<String> = uses.iter().map(|u| (*u).to_owned()).collect();
        uses.sort();
        assert_eq!(ticked(&row[1]), uses, "what the doc says {dir} uses");
    }
    let layers = doc_table(&doc, "| layer | modules |");
    assert_eq!(layers.len(), TRAIN_LAYERS.len(), "the doc's train layers");
    for (row, (name, modules)) in layers.iter().zip(TRAIN_LAYERS) {
        assert_eq!(row[0], *name, "train's layers, bottom first");
        let mut modules: Vec<String> = modules.iter().map(|m| (*m).to_owned()).collect();
        modules.sort();
        assert_eq!(
            ticked(&row[1]),
            modules,
            "the modules of train's layer `{name}`"
        );
    }
}
