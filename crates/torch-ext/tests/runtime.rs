//! The process really runs on the libtorch it was built against, with its CUDA library loaded.

use kiln_torch_ext::cuda;
use kiln_torch_ext::runtime::{self, CudaLibrary};

#[test]
fn compiled_against_libtorch_2_11() {
    assert_eq!(runtime::torch_version(), "2.11.0");
}

#[test]
fn libtorch_is_found_without_ld_library_path() {
    // The build script sets an rpath; this binary must not rely on LD_LIBRARY_PATH.
    let lib = runtime::libtorch_lib_dir().unwrap();
    assert!(lib.join("libtorch_cpu.so").exists(), "{}", lib.display());
    let loaded = runtime::loaded_libraries();
    assert!(
        loaded.iter().any(|p| p.ends_with("libtorch_cpu.so")),
        "libtorch_cpu.so not in {loaded:?}"
    );
}

#[test]
fn libtorch_cuda_is_loaded_when_shipped() {
    // The as-needed trap: without kiln's link arguments, libtorch_cuda.so is dropped at link
    // time. This checks the state as linked, before any run-time loading could repair it.
    match runtime::cuda_library().unwrap() {
        CudaLibrary::Loaded(path) => {
            eprintln!("libtorch_cuda loaded from {}", path.display());
        }
        CudaLibrary::NotShipped => {
            eprintln!("this libtorch has no libtorch_cuda (CPU build): nothing to check");
        }
        CudaLibrary::NotLoaded(path) => panic!(
            "{} exists but was not loaded: the --no-as-needed link arguments are missing",
            path.display()
        ),
    }
    // And the safety net agrees (a no-op here).
    assert_eq!(
        runtime::ensure_cuda_library().unwrap(),
        runtime::cuda_library().unwrap()
    );
}

#[test]
fn cuda_queries_agree_with_tch() {
    let ours = cuda::device_count().unwrap();
    let theirs = usize::try_from(tch::Cuda::device_count()).unwrap();
    assert_eq!(ours, theirs);
    if ours == 0 {
        eprintln!(
            "no CUDA device here (built_with_cuda={}): checking the error path only",
            cuda::built_with_cuda()
        );
        let err = cuda::device_properties(0).unwrap_err().to_string();
        assert!(err.contains("0"), "{err}");
    } else {
        for i in 0..ours {
            let p = cuda::device_properties(i).unwrap();
            eprintln!("CUDA device {i}: {p:?}");
            assert!(!p.name.is_empty());
            assert!(p.total_memory_bytes > 0);
            assert!(p.compute_capability.0 >= 3);
        }
    }
}

#[test]
fn cuda_build_versions_are_reported_for_a_cuda_libtorch() {
    match runtime::cuda_library().unwrap() {
        CudaLibrary::Loaded(_) => {
            let (cudart, cudnn) = cuda::build_versions().unwrap();
            eprintln!("compiled with CUDA {cudart}, cuDNN {cudnn:?}");
            assert!(
                cudart.starts_with("13."),
                "the 2.11 wheel is a CUDA 13 build: {cudart}"
            );
            assert!(cudnn.is_some_and(|v| v.starts_with("9.")));
        }
        _ => assert!(cuda::build_versions().is_err()),
    }
}
