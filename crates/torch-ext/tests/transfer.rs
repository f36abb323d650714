//! Host staging buffers and host-to-device copies: the CPU path everywhere, the pinned path
//! where a CUDA device is present (and its clean refusal where not), and the CUDA side-stream
//! copy in an `#[ignore]`d test that `cargo xtask test --cuda` runs.

use kiln_torch_ext::transfer::{copy_to_device, host_empty_f32, host_tensor_f32, host_tensor_i64};
use tch::{Device, Kind, Tensor};

fn cuda_present() -> bool {
    kiln_torch_ext::cuda::device_count().unwrap_or(0) > 0
}

#[test]
fn host_tensors_hold_a_copy_of_the_data_in_the_given_shape() {
    let data: Vec<f32> = (0..12).map(|i| i as f32 * 0.25).collect();
    let t = host_tensor_f32(&data, &[3, 4], false).unwrap();
    assert_eq!(t.size(), [3, 4]);
    assert_eq!(t.kind(), Kind::Float);
    let back: Vec<f32> = Vec::try_from(t.flatten(0, -1)).unwrap();
    assert_eq!(back, data);
    let labels = host_tensor_i64(&[3, -1, 7], &[3], false).unwrap();
    assert_eq!(Vec::<i64>::try_from(labels).unwrap(), [3, -1, 7]);
}

#[test]
fn an_empty_host_tensor_has_its_shape_and_refuses_a_bad_one() {
    let mut t = host_empty_f32(&[2, 3], false).unwrap();
    assert_eq!((t.size(), t.kind()), (vec![2, 3], Kind::Float));
    let _ = t.fill_(1.5);
    assert_eq!(t.sum(Kind::Double).double_value(&[]), 9.0);
    assert_eq!(host_empty_f32(&[0], false).unwrap().numel(), 0);
    let e = host_empty_f32(&[2, -3], false).unwrap_err().to_string();
    assert!(e.contains("host_empty_f32") && e.contains("[2, -3]"), "{e}");
}

#[test]
fn a_shape_that_does_not_fit_the_data_is_an_error_not_a_crash() {
    let e = host_tensor_f32(&[1.0; 6], &[4, 2], false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("host_tensor") && e.contains("24 bytes"), "{e}");
    assert!(host_tensor_f32(&[1.0], &[-1], false).is_err());
}

#[test]
fn pinned_host_memory_needs_cuda_and_otherwise_fails_cleanly() {
    let result = host_tensor_f32(&[1.0, 2.0], &[2], true);
    if cuda_present() {
        let t = result.unwrap();
        assert!(t.is_pinned(Device::Cuda(0)), "staging buffer not pinned");
    } else {
        let e = result.unwrap_err().to_string();
        assert!(e.contains("host_tensor"), "{e}");
        eprintln!("no CUDA device: pinned allocation refused as expected: {e}");
    }
}

#[test]
fn copying_to_the_cpu_is_the_tensor_itself() {
    let src = Tensor::from_slice(&[1.0f32, 2.0, 3.0]);
    let copy = copy_to_device(&src, Device::Cpu).unwrap();
    assert_eq!(copy.kind(), Kind::Float);
    let t = copy.finish().unwrap();
    assert_eq!(t.data_ptr(), src.data_ptr(), "no copy on the CPU");
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn side_stream_copies_on_cuda_arrive_intact() {
    assert!(
        cuda_present(),
        "this test needs a CUDA device and this machine has none (run it on one with a GPU)"
    );
    let data: Vec<f32> = (0..1 << 20).map(|i| (i % 977) as f32).collect();
    let src = host_tensor_f32(&data, &[1024, 1024], true).unwrap();
    let pending = copy_to_device(&src, Device::Cuda(0)).unwrap();
    let on_device = pending.finish().unwrap();
    assert_eq!(on_device.device(), Device::Cuda(0));
    // The compute stream waits for the copy, so this sum sees every value.
    let sum = on_device.sum(Kind::Double).double_value(&[]);
    let want: f64 = data.iter().map(|v| f64::from(*v)).sum();
    assert_eq!(sum, want);
    // An abandoned copy is dropped without being waited for or leaking its event.
    drop(copy_to_device(&src, Device::Cuda(0)).unwrap());
}

#[test]
fn tensors_from_vectors_share_their_memory_and_outlive_the_caller() {
    use kiln_torch_ext::transfer::{tensor_from_vec_f32, tensor_from_vec_i64};
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let ptr = data.as_ptr() as usize;
    let t = tensor_from_vec_f32(data, &[2, 3]).unwrap();
    assert_eq!(t.data_ptr() as usize, ptr, "no copy");
    let view = t.get(1); // keeps the storage alive after `t` is gone
    drop(t);
    assert_eq!(Vec::<f32>::try_from(view).unwrap(), [3.0, 4.0, 5.0]);
    let labels = tensor_from_vec_i64(vec![4, 5], &[2]).unwrap();
    assert_eq!(Vec::<i64>::try_from(&labels).unwrap(), [4, 5]);
    let e = tensor_from_vec_f32(vec![1.0; 5], &[2, 3])
        .unwrap_err()
        .to_string();
    assert!(e.contains("5 values") && e.contains("[2, 3]"), "{e}");
}
