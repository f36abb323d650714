//! Accelerator memory statistics and CPU thread settings. On a machine without a GPU the memory
//! calls must fail cleanly (and say why); with one, they must track a real allocation.

use kiln_torch_ext::{cuda, memory};
use tch::{Device, Kind, Tensor};

#[test]
fn memory_stats_track_allocations_or_fail_cleanly_without_a_gpu() {
    if cuda::device_count().unwrap() == 0 {
        let err = memory::stats(0).unwrap_err().to_string();
        eprintln!("no CUDA device here, checked the error path: {err}");
        assert!(err.contains("memory stats"), "{err}");
        let err = cuda::set_memory_fraction(0.5, 0).unwrap_err().to_string();
        assert!(
            err.contains("out of range") || err.contains("without CUDA"),
            "{err}"
        );
        return;
    }
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
