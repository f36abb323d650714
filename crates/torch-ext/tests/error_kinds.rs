//! Errors cross the C ABI with their kind: real calls into libtorch (and kiln's own C++ checks)
//! that run out of memory, get an invalid argument, hit an unimplemented backend or fail
//! otherwise come back as those kinds, and a kind a Rust callback reports survives the round
//! trip through C++.

use kiln_torch_ext::recompute::checkpoint;
use kiln_torch_ext::{
    CallbackError, Error, ErrorKind, blend, dropout, layout, optim, rng, tch_out_of_memory,
    transfer,
};
use tch::{Device, Kind, Tensor};

const FLOAT: (Kind, Device) = (Kind::Float, Device::Cpu);

/// A tensor of 2^48 floats (1 PiB) that takes 4 bytes: a one-element tensor expanded.
fn absurdly_large() -> Tensor {
    Tensor::zeros([1], (Kind::Float, Device::Cpu)).expand([1i64 << 48], false)
}

fn kind_of<T>(r: Result<T, Error>) -> (ErrorKind, String) {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => (e.kind(), e.to_string()),
    }
}

#[test]
fn running_out_of_cpu_memory_is_out_of_memory() {
    // kiln_dropout_mask allocates a mask the size of `like`.
    let e = dropout::dropout_mask(&absurdly_large(), 0.5, 0, 0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    assert_eq!(e.kind(), ErrorKind::OutOfMemory);
    assert!(e.to_string().contains("dropout mask"), "{e}");
}

#[test]
fn invalid_arguments_are_invalid_argument() {
    // libtorch's own check (a c10::TypeError): an RNG state must be a uint8 tensor.
    let float_state = Tensor::zeros([3], (Kind::Float, Device::Cpu));
    let (kind, text) = kind_of(rng::set_cpu_rng_state(&float_state));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("ByteTensor"), "{text}");
    // kiln's own check in C++ (TORCH_CHECK_VALUE).
    let flat = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    let (kind, text) = kind_of(layout::to_channels_last(&flat));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("4-D"), "{text}");
    // Rejected on the Rust side, before C++.
    let (kind, text) = kind_of(dropout::dropout(&flat, 1.5, 0, 0));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
}

#[test]
fn a_window_that_does_not_fit_the_sums_is_refused_before_anything_is_written() {
    // The sums start uninitialised (here 7): rows are zeroed as windows reach them.
    let (sum, count) = (
        Tensor::full([1, 2, 6, 6], 7.0, FLOAT),
        Tensor::full([1, 1, 6, 6], 7.0, FLOAT),
    );
    // Four 4×4 windows covering 6×6, the outputs of window i all i + 1, weights 1.
    let starts = [vec![0, 0], vec![0, 2], vec![2, 0], vec![2, 2]];
    let outs = Tensor::arange_start(1, 5, FLOAT)
        .view([4, 1, 1, 1])
        .expand([4, 2, 4, 4], false)
        .contiguous();
    let weight = Tensor::ones([1, 1, 4, 4], FLOAT);
    let mut rows = blend::Rows::new(&[6, 6], &[4, 4], &starts).unwrap();
    let blend = |starts: &[Vec<i64>], outs: &Tensor, rows: &mut blend::Rows| {
        blend::blend_windows(&sum, &count, outs, &weight, starts, rows)
    };
    let two = outs.narrow(0, 0, 2);
    let (kind, text) = kind_of(blend(&[vec![0, 0], vec![2, 3]], &two, &mut rows));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("window 1 starts at 3"), "{text}");
    let (kind, text) = kind_of(blend(&[vec![0, 0], vec![2]], &two, &mut rows));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    let (kind, text) = kind_of(blend(
        &[vec![0, 0], vec![2, 2]],
        &two.to_kind(Kind::Double),
        &mut rows,
    ));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("float32"), "{text}");
    let (kind, text) = kind_of(blend(
        &[vec![0, 0], vec![1, 1]],
        &two,
        &mut blend::Rows::new(&[6], &[4], &[vec![0]]).unwrap(),
    ));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("row plans"), "{text}");
    // Row 1 is reached by two windows of the run; a batch of three reaching it is refused.
    let three = outs.narrow(0, 0, 3);
    let (kind, text) = kind_of(blend(
        &starts[..3],
        &three,
        &mut blend::Rows::new(&[6, 6], &[4, 4], &starts[..2]).unwrap(),
    ));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("planned"), "{text}");
    assert_eq!(f64::try_from(sum.mean(Kind::Float)).unwrap(), 7.0);
    assert_eq!(f64::try_from(count.mean(Kind::Float)).unwrap(), 7.0);
    // The first two windows: rows 0..2 have no window left and are blended (1 where window 0
    // alone lies, 1.5 where both do, 2 where window 1 alone does); rows 2..4 hold sums (their
    // summed weights 1 or 2), and rows 4..6 are untouched.
    blend(&starts[..2], &two, &mut rows).unwrap();
    let at = |t: &Tensor, y: i64, x: i64| f64::try_from(t.get(0).get(0).get(y).get(x)).unwrap();
    let blended = [(0, 0, 1.0), (1, 2, 1.5), (0, 5, 2.0)];
    assert!(blended.iter().all(|&(y, x, v)| at(&sum, y, x) == v));
    assert_eq!((at(&sum, 3, 3), at(&count, 3, 3)), (3.0, 2.0));
    assert_eq!(f64::try_from(sum.narrow(2, 4, 2).min()).unwrap(), 7.0);
    // The last two: every row blended, the centre the mean of all four windows.
    blend(&starts[2..], &outs.narrow(0, 2, 2), &mut rows).unwrap();
    rows.finish_the_rest(&sum, &count).unwrap();
    assert_eq!(
        (at(&sum, 3, 3), at(&sum, 5, 5), at(&sum, 2, 1)),
        (2.5, 4.0, 2.0)
    );
    assert_eq!(f64::try_from(count.sum(Kind::Float)).unwrap(), 64.0);
    // A plan refuses a window outside the sums.
    let (kind, text) = kind_of(blend::Rows::new(&[6, 6], &[4, 4], &[vec![3, 0]]));
    assert_eq!(kind, ErrorKind::InvalidArgument, "{text}");
    assert!(text.contains("window 0 starts at [3, 0]"), "{text}");
}

#[test]
fn a_backend_without_the_kernel_is_not_implemented() {
    let sparse = Tensor::zeros([3, 3], (Kind::Float, Device::Cpu)).to_sparse_sparse_dim(2);
    let (kind, text) = kind_of(optim::clip_grad_norm(&[sparse], 1.0));
    assert_eq!(kind, ErrorKind::NotImplemented, "{text}");
    assert!(text.contains("SparseCPU"), "{text}");
}

#[test]
fn other_failures_are_other() {
    // The right type, the wrong size: a plain c10::Error.
    let short_state = Tensor::zeros([3], (Kind::Uint8, Device::Cpu));
    let (kind, text) = kind_of(rng::set_cpu_rng_state(&short_state));
    assert_eq!(kind, ErrorKind::Other, "{text}");
    assert!(text.contains("size"), "{text}");
}

#[test]
fn a_callback_error_keeps_its_kind_through_cpp() {
    let x = Tensor::ones([2, 4], (Kind::Float, Device::Cpu));
    // Messages that say nothing of memory, so only the kind code can carry it.
    for kind in [
        ErrorKind::OutOfMemory,
        ErrorKind::InvalidArgument,
        ErrorKind::NotImplemented,
        ErrorKind::Distributed,
        ErrorKind::Other,
    ] {
        let e = checkpoint(&x, move |_| {
            Err(CallbackError::new(kind, "layer 3 gave up"))
        })
        .unwrap_err();
        assert_eq!(e.kind(), kind, "{e}");
        assert!(e.to_string().contains("layer 3 gave up"), "{e}");
    }
    let e = checkpoint(&x, |_| Err("a message alone".into())).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Other, "{e}");
    // A real out-of-memory inside the block, from a tch call.
    let e = checkpoint(&x, |x| {
        let row = x.f_narrow(0, 0, 1)?;
        Ok(row.f_expand([1i64 << 48, 4], false)?.f_contiguous()?)
    })
    .unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
}

#[test]
fn tch_errors_are_recognised_as_out_of_memory_by_their_text_only_when_they_are() {
    let oom = Tensor::f_empty([1i64 << 48], (Kind::Float, Device::Cpu)).unwrap_err();
    assert!(tch_out_of_memory(&oom), "{oom}");
    let a = Tensor::zeros([2, 3], (Kind::Float, Device::Cpu));
    let shapes = a.f_matmul(&a).unwrap_err();
    assert!(!tch_out_of_memory(&shapes), "{shapes}");
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn running_out_of_memory_on_cuda_is_out_of_memory() {
    assert!(
        kiln_torch_ext::cuda::device_count().unwrap_or(0) > 0,
        "this test needs a CUDA device and this machine has none (run it on one with a GPU)"
    );
    // The copy materialises all 2^48 elements on the device: the caching allocator throws
    // c10::OutOfMemoryError.
    let copy = transfer::copy_to_device(&absurdly_large(), Device::Cuda(0));
    let (kind, text) = kind_of(copy.and_then(|c| c.finish()));
    assert_eq!(kind, ErrorKind::OutOfMemory, "{text}");
    assert!(text.contains("CUDA out of memory"), "{text}");
    // The process goes on: a small allocation still works.
    let small = Tensor::f_ones([4], (Kind::Float, Device::Cuda(0))).unwrap();
    assert_eq!(small.sum(Kind::Float).double_value(&[]), 4.0);
}
