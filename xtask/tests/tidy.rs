//! Repository checks run as tests: the architecture invariants of docs/ARCHITECTURE.md that a
//! machine can check, so that breaking one fails `cargo xtask test` instead of a review.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn source_files(ext: &str) -> Vec<PathBuf> {
    let mut all = vec![];
    for dir in ["crates", "xtask", "benches"] {
        files_under(&root().join(dir), &mut all);
    }
    all.retain(|p| p.extension().is_some_and(|e| e == ext));
    all
}

#[test]
fn every_rust_file_starts_with_a_doc_line_saying_what_it_is_for() {
    let missing: Vec<_> = source_files("rs")
        .into_iter()
        .filter(|p| {
            let text = fs::read_to_string(p).unwrap();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            !first.starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "files without a `//!` header: {missing:?}"
    );
}

#[test]
fn only_the_native_crate_contains_cpp() {
    let mut native = vec![];
    for ext in ["cpp", "cc", "cxx", "h", "hpp", "cu"] {
        native.extend(source_files(ext));
    }
    let outside: Vec<_> = native
        .iter()
        .filter(|p| !p.starts_with(root().join("crates/torch-ext")))
        .collect();
    assert!(
        outside.is_empty(),
        "C/C++ outside crates/torch-ext: {outside:?}"
    );
    assert!(!native.is_empty(), "the native crate's C++ was not found");
}

/// The names listed in a manifest's `[dependencies]` table.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = fs::read_to_string(manifest).unwrap();
    let mut in_deps = false;
    let mut deps = vec![];
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap().trim();
            deps.push(name.to_owned());
        }
    }
    deps
}

#[test]
fn crates_only_know_the_layers_below_them() {
    // Which kiln crates each crate may depend on (docs/ARCHITECTURE.md, "Layering").
    let allowed: BTreeMap<&str, &[&str]> = BTreeMap::from([
        ("torch-ext", &[][..]),
        ("device", &["kiln-torch-ext"][..]),
        ("profiles", &["kiln-device"][..]),
        ("config", &["kiln-device", "kiln-profiles"][..]),
        ("data", &[][..]),
        (
            "train",
            &["kiln-torch-ext", "kiln-device", "kiln-config", "kiln-data"][..],
        ),
        (
            "infer",
            &[
                "kiln-torch-ext",
                "kiln-device",
                "kiln-config",
                "kiln-data",
                "kiln-train",
            ][..],
        ),
        (
            "cli",
            &[
                "kiln-torch-ext",
                "kiln-device",
                "kiln-profiles",
                "kiln-config",
                "kiln-data",
                "kiln-train",
                "kiln-infer",
            ][..],
        ),
    ]);
    let mut seen = vec![];
    for entry in fs::read_dir(root().join("crates")).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let manifest = entry.path().join("Cargo.toml");
        if !manifest.exists() {
            continue;
        }
        let Some(ok) = allowed.get(name.as_str()) else {
            panic!(
                "crates/{name} is not in the layering table; add it here and to ARCHITECTURE.md"
            );
        };
        for dep in dependencies(&manifest) {
            if dep.starts_with("kiln-") {
                assert!(
                    ok.contains(&dep.as_str()),
                    "crates/{name} must not depend on {dep}"
                );
            }
            if dep == "nvml-wrapper" {
                assert_eq!(name, "device", "only crates/device talks to NVML");
            }
            if dep == "anyhow" {
                assert_eq!(name, "cli", "anyhow belongs to the binary alone");
            }
        }
        seen.push(name);
    }
    assert_eq!(seen.len(), allowed.len(), "crates found: {seen:?}");
}

#[test]
fn xtask_has_no_dependencies() {
    let deps = dependencies(&root().join("xtask/Cargo.toml"));
    assert!(
        deps.is_empty(),
        "xtask must build before libtorch exists: {deps:?}"
    );
}

#[test]
fn ci_runs_the_readme_test_command() {
    let readme = fs::read_to_string(root().join("README.md")).unwrap();
    let ci = fs::read_to_string(root().join(".ci/run")).unwrap();
    assert!(readme.contains("cargo xtask test"));
    assert!(readme.contains("cargo xtask train"));
    assert!(
        ci.lines().any(|l| l.trim() == "cargo xtask test"),
        ".ci/run must run `cargo xtask test`"
    );
}
