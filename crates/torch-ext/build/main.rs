//! Build script of kiln-torch-ext: compiles the C++ extension against the libtorch torch-sys
//! linked, adds the CUDA-header part when that libtorch has CUDA, and links our own tests.

mod link_libtorch;

use std::env;
use std::path::{Path, PathBuf};

/// Where CUDA headers may be: the pip wheel's layout first, then the usual toolkits.
fn cuda_include_dir(libtorch_root: &Path) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=CUDA_HOME");
    let mut candidates = vec![];
    if let Some(site_packages) = libtorch_root.parent() {
        candidates.push(site_packages.join("nvidia/cu13/include"));
        candidates.push(site_packages.join("nvidia/cuda_runtime/include"));
    }
    if let Some(home) = env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("include"));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates
        .into_iter()
        .find(|dir| dir.join("cuda_runtime_api.h").exists())
}

/// Where NCCL's header may be: the pip wheel's `nvidia/nccl` (the NCCL torch pins, whose
/// version macros c10d's NCCL header reads), then `NCCL_INCLUDE_DIR`, CUDA_HOME, the system.
fn nccl_include_dir(libtorch_root: &Path, cuda_include: &Path) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=NCCL_INCLUDE_DIR");
    let mut candidates = vec![];
    if let Some(site_packages) = libtorch_root.parent() {
        candidates.push(site_packages.join("nvidia/nccl/include"));
    }
    if let Some(dir) = env::var_os("NCCL_INCLUDE_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    candidates.push(cuda_include.to_path_buf());
    candidates.push(PathBuf::from("/usr/include"));
    candidates
        .into_iter()
        .find(|dir| dir.join("nccl.h").exists())
}

/// A C++17 build against libtorch's headers (and ours in `csrc/`), as libtorch was built.
fn base_build(root: &Path) -> cc::Build {
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
        .pic(true)
        .warnings(false)
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .include(root.join("include"))
        .include(root.join("include/torch/csrc/api/include"))
        .include("csrc");
    build
}

/// c10d's NCCL process group (csrc/kiln_nccl.cpp) in a build of its own: its macros
/// (USE_C10D_NCCL, USE_CUDA) stay out of the other translation units.
fn build_nccl(root: &Path, cuda_include: &Path, nccl_include: &Path) {
    let mut build = base_build(root);
    build
        .define("USE_C10D_NCCL", None)
        .define("USE_CUDA", None)
        .include(nccl_include)
        .include(cuda_include);
    if cuda_include.join("cccl").is_dir() {
        build.include(cuda_include.join("cccl"));
    }
    build
        .file("csrc/kiln_nccl.cpp")
        .compile("kiln_torch_ext_nccl");
    println!("cargo:rustc-cfg=kiln_nccl");
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(kiln_cuda)");
    println!("cargo::rustc-check-cfg=cfg(kiln_nccl)");
    println!("cargo:rerun-if-changed=csrc");
    let lib = link_libtorch::libtorch_lib_dir()
        .expect("torch-sys exports DEP_TCH_LIBTORCH_LIB; run `cargo xtask setup` first");
    let root = lib
        .parent()
        .expect("the libtorch lib dir has a parent")
        .to_path_buf();
    // Resolve `.kiln/libtorch` so that the wheel's `nvidia/` directory beside it is found.
    let real_root = root.canonicalize().unwrap_or_else(|_| root.clone());
    // Re-export for our dependents' build scripts (DEP_KILN_TORCH_LIBTORCH_LIB).
    println!("cargo:libtorch_lib={}", lib.display());

    let mut build = base_build(&root);
    build
        .file("csrc/kiln_ext.cpp")
        .file("csrc/kiln_train.cpp")
        .file("csrc/kiln_autograd.cpp")
        .file("csrc/kiln_script.cpp")
        .file("csrc/kiln_aoti.cpp")
        .file("csrc/kiln_blend.cpp")
        // c10d's Gloo process group (csrc/gloo/ holds kiln's stand-ins for gloo's headers).
        .define("USE_C10D_GLOO", None)
        .file("csrc/kiln_dist.cpp");

    let has_cuda_libs =
        lib.join("libtorch_cuda.so").exists() && lib.join("libc10_cuda.so").exists();
    match (has_cuda_libs, cuda_include_dir(&real_root)) {
        (true, Some(cuda_include)) => {
            match nccl_include_dir(&real_root, &cuda_include) {
                Some(nccl) => build_nccl(&root, &cuda_include, &nccl),
                None => println!(
                    "cargo:warning=libtorch has CUDA but NCCL's header was not found (looked in \
                     the wheel's nvidia/nccl, NCCL_INCLUDE_DIR, CUDA_HOME); data-parallel \
                     training on several GPUs is left out"
                ),
            }
            build.include(cuda_include).file("csrc/kiln_cuda.cpp");
            println!("cargo:rustc-cfg=kiln_cuda");
            println!("cargo:rustc-link-lib=dylib=c10_cuda");
            println!("cargo:rustc-link-lib=dylib=torch_cuda");
        }
        (true, None) => println!(
            "cargo:warning=libtorch has CUDA but no CUDA headers were found (looked beside it \
             and in CUDA_HOME); kiln's CUDA-only native functions are left out"
        ),
        (false, _) => {}
    }
    build.compile("kiln_torch_ext");
    link_libtorch::main();
}
