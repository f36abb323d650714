//! Tidy test of the layering: the crates of kiln's vocabulary and configuration build and test
//! without libtorch. It asks `cargo tree` for each one's dependencies (normal, build and dev) and
//! fails if tch, torch-sys or a kiln crate that links them appears; kiln-device, which does link
//! libtorch, is the control that shows the check sees them.

use std::path::Path;
use std::process::Command;

/// Crates that bring libtorch in.
const LIBTORCH_CRATES: &[&str] = &["tch", "torch-sys", "kiln-torch-ext", "kiln-device"];

/// The names of every package in `package`'s dependency tree, itself included.
fn dependencies(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new(cargo)
        .current_dir(&root)
        .args([
            "tree", "--edges", "all", "--prefix", "none", "--format", "{p}",
        ])
        .args(["--package", package])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn libtorch_in(package: &str) -> Vec<String> {
    let mut found: Vec<String> = dependencies(package)
        .into_iter()
        .filter(|name| LIBTORCH_CRATES.contains(&name.as_str()))
        .collect();
    found.sort();
    found.dedup();
    found
}

#[test]
fn core_profiles_and_config_do_not_depend_on_libtorch() {
    for package in ["kiln-core", "kiln-profiles", "kiln-config"] {
        let found = libtorch_in(package);
        assert!(
            found.is_empty(),
            "{package} must build and test without libtorch, but depends on {found:?} \
             (see docs/ARCHITECTURE.md, Crates)"
        );
    }
}

#[test]
fn the_check_sees_libtorch_where_it_is() {
    let found = libtorch_in("kiln-device");
    assert!(
        found.contains(&"tch".to_owned()) && found.contains(&"kiln-torch-ext".to_owned()),
        "{found:?}"
    );
}
