//! Shared build script of every kiln package that links libtorch (used through
//! `build = "../torch-ext/build/link_libtorch.rs"`): makes its binaries, tests and benches run
//! without `LD_LIBRARY_PATH` and really load `libtorch_cuda`.
//!
//! `cargo:rustc-link-arg` applies only to the package whose build script prints it, so each
//! such package uses this script; `kiln-torch-ext` also calls it from its own build script.

use std::env;
use std::path::PathBuf;

/// The libtorch `lib/` directory torch-sys linked against.
pub fn libtorch_lib_dir() -> Option<PathBuf> {
    // Metadata from torch-sys (`links = "tch"`) or kiln-torch-ext (`links = "kiln_torch"`),
    // seen by direct dependents; else the same variables torch-sys reads.
    for key in ["DEP_TCH_LIBTORCH_LIB", "DEP_KILN_TORCH_LIBTORCH_LIB"] {
        println!("cargo:rerun-if-env-changed={key}");
        if let Some(dir) = env::var_os(key).filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(dir));
        }
    }
    for key in ["LIBTORCH_LIB", "LIBTORCH"] {
        println!("cargo:rerun-if-env-changed={key}");
        if let Some(dir) = env::var_os(key).filter(|v| !v.is_empty()) {
            return Some(PathBuf::from(dir).join("lib"));
        }
    }
    None
}

pub fn main() {
    println!("cargo:rerun-if-changed=../torch-ext/build/link_libtorch.rs");
    let Some(lib) = libtorch_lib_dir() else {
        println!(
            "cargo:warning=libtorch not found: run `cargo xtask setup` (binaries will need \
             LD_LIBRARY_PATH)"
        );
        return;
    };
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "windows" {
        return;
    }
    // 1. No LD_LIBRARY_PATH needed: libtorch's own RPATH then finds the CUDA runtime wheels.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // 2. The as-needed trap: rustc links with --as-needed and no kiln code references a
    //    libtorch_cuda symbol, so the library would be dropped and CUDA never found.
    //    libtorch.so lists libtorch_cuda.so as NEEDED; keeping it keeps CUDA.
    if target_os == "linux" && lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
        println!("cargo:rustc-link-arg=-Wl,--as-needed");
    }
}
