//! Per-thread autocast on CPU (bf16 and fp16) and CUDA state, through the scoped guard.

use kiln_torch_ext::autocast::{self, AutocastDtype, AutocastGuard, DeviceType};
use tch::{Device, Kind, Tensor};

fn matmul_kind() -> Kind {
    let a = Tensor::ones([4, 4], (Kind::Float, Device::Cpu));
    a.matmul(&a).kind()
}

#[test]
fn cpu_autocast_guard_casts_matmul_and_restores_state() {
    assert!(!autocast::is_enabled(DeviceType::Cpu).unwrap());
    assert_eq!(matmul_kind(), Kind::Float);
    for dtype in [AutocastDtype::BFloat16, AutocastDtype::Float16] {
        let before = autocast::dtype(DeviceType::Cpu).unwrap();
        {
            let _guard = AutocastGuard::new(DeviceType::Cpu, dtype).unwrap();
            assert!(autocast::is_enabled(DeviceType::Cpu).unwrap());
            assert_eq!(autocast::dtype(DeviceType::Cpu).unwrap(), Some(dtype));
            assert_eq!(matmul_kind(), dtype.kind(), "matmul runs in {dtype:?}");
        }
        assert!(!autocast::is_enabled(DeviceType::Cpu).unwrap());
        assert_eq!(autocast::dtype(DeviceType::Cpu).unwrap(), before);
        assert_eq!(matmul_kind(), Kind::Float);
    }
}

#[test]
fn nested_guards_restore_the_outer_region() {
    let _outer = AutocastGuard::new(DeviceType::Cpu, AutocastDtype::BFloat16).unwrap();
    {
        let _inner = AutocastGuard::new(DeviceType::Cpu, AutocastDtype::Float16).unwrap();
        assert_eq!(matmul_kind(), Kind::Half);
    }
    assert!(autocast::is_enabled(DeviceType::Cpu).unwrap());
    assert_eq!(matmul_kind(), Kind::BFloat16);
}

#[test]
fn autocast_state_is_per_thread() {
    let _guard = AutocastGuard::new(DeviceType::Cpu, AutocastDtype::BFloat16).unwrap();
    let other = std::thread::spawn(|| {
        (
            autocast::is_enabled(DeviceType::Cpu).unwrap(),
            matmul_kind(),
        )
    })
    .join()
    .unwrap();
    assert_eq!(other, (false, Kind::Float));
    assert_eq!(matmul_kind(), Kind::BFloat16);
}

#[test]
fn cuda_autocast_dtype_is_settable_without_a_gpu() {
    // The state exists even where no GPU does; the trainer sets it before knowing.
    for dtype in [AutocastDtype::BFloat16, AutocastDtype::Float16] {
        autocast::set_dtype(DeviceType::Cuda, dtype).unwrap();
        assert_eq!(autocast::dtype(DeviceType::Cuda).unwrap(), Some(dtype));
    }
    autocast::set_enabled(DeviceType::Cuda, true).unwrap();
    assert!(autocast::is_enabled(DeviceType::Cuda).unwrap());
    autocast::set_enabled(DeviceType::Cuda, false).unwrap();
    assert!(!autocast::is_enabled(DeviceType::Cuda).unwrap());
}
