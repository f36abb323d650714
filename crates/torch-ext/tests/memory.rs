//! Accelerator memory statistics and CPU thread settings. For a device that is not there the
//! memory calls must fail cleanly (and say why); on a CUDA device they must track a real
//! allocation (an `#[ignore]`d test that `cargo xtask test --cuda` runs).

use kiln_torch_ext::{cuda, memory};
use tch::{Device, Kind, Tensor};

#[test]
fn memory_calls_for_a_device_that_is_not_there_fail_cleanly() {
    // The first index past the last device: every device on a machine without a GPU.
    let missing = cuda::device_count().unwrap();
    let err = memory::stats(missing).unwrap_err().to_string();
    assert!(err.contains("memory stats"), "{err}");
    let err = cuda::set_memory_fraction(0.5, missing)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("out of range") || err.contains("without CUDA"),
        "{err}"
    );
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn memory_stats_on_cuda_track_allocations() {
    assert!(
        cuda::device_count().unwrap() > 0,
        "this test needs a CUDA device and this machine has none (run it on one with a GPU)"
    );
    memory::reset_peak(0).unwrap();
    let before = memory::stats(0).unwrap();
    let t = Tensor::zeros([64, 1024, 1024], (Kind::Float, Device::Cuda(0)));
    let during = memory::stats(0).unwrap();
    assert!(
        during.allocated >= before.allocated + 256 * 1024 * 1024,
        "{during:?}"
    );
    assert!(during.allocated_peak >= during.allocated);
    drop(t);
    let after = memory::stats(0).unwrap();
    assert!(after.allocated < during.allocated);
    assert!(after.reserved > 0, "the cache keeps the block");
    memory::empty_cache().unwrap();
    assert!(memory::stats(0).unwrap().reserved < after.reserved);
    cuda::set_memory_fraction(0.9, 0).unwrap();
}

#[test]
fn memory_fraction_is_checked_before_libtorch() {
    for bad in [0.0, -0.1, 1.5, f64::NAN] {
        let err = cuda::set_memory_fraction(bad, 0).unwrap_err().to_string();
        assert!(err.contains("must be in (0, 1]"), "{err}");
    }
}

#[test]
fn intra_op_threads_can_be_set_and_read_back() {
    let (intra, _) = memory::num_threads().unwrap();
    memory::set_num_threads(1).unwrap();
    assert_eq!(memory::num_threads().unwrap().0, 1);
    memory::set_num_threads(intra.max(1)).unwrap();
    assert_eq!(memory::num_threads().unwrap().0, intra.max(1));
}
