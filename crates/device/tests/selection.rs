//! Device selection and GPU-view merging on machines described by fixtures: single and multi-GPU
//! boxes, reordered CUDA indices, no NVML, NVML without CUDA, CPU-only, and Macs.

use kiln_device::facts::{
    ComputeCapability, CpuFacts, GpuFacts, GpuSource, MachineFacts, NvmlStatus,
};
use kiln_device::probe::{TorchGpu, merge_gpu_views};
use kiln_device::select::{available_devices, cuda_diagnosis, select};
use kiln_device::{Device, DeviceRequest, SelectError};

const GIB: u64 = 1 << 30;

fn cpu() -> CpuFacts {
    CpuFacts {
        model: "Intel(R) Xeon(R) Platinum 8481C".into(),
        physical_cores: 1,
        logical_cores: 2,
        total_memory_bytes: 24 * GIB,
        available_memory_bytes: 20 * GIB,
        avx512: true,
        avx512_bf16: true,
        amx_bf16: true,
    }
}

/// A GPU as NVML reports it (no CUDA index: only libtorch knows that).
fn nvml_gpu(i: u32, name: &str, total_gib: u64, free_gib: u64, cc: (u32, u32)) -> GpuFacts {
    GpuFacts {
        cuda_index: None,
        nvml_index: Some(i),
        name: name.into(),
        uuid: Some(format!("GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd")),
        total_memory_bytes: total_gib * GIB,
        free_memory_bytes: Some(free_gib * GIB),
        compute_capability: ComputeCapability::new(cc.0, cc.1),
        utilization_percent: Some(0),
        temperature_celsius: Some(35),
        power_watts: Some(70.0),
        source: GpuSource::NvmlOnly,
    }
}

fn torch_gpu(cuda: usize, of: &GpuFacts) -> TorchGpu {
    TorchGpu {
        cuda_index: cuda,
        name: of.name.clone(),
        uuid: of.uuid.clone(),
        total_memory_bytes: of.total_memory_bytes - GIB / 2,
        compute_capability: of.compute_capability,
    }
}

fn machine(gpus: Vec<GpuFacts>, nvml: bool, os: &str, mps: bool) -> MachineFacts {
    let libtorch_cuda = gpus.iter().any(|g| g.cuda_index.is_some());
    MachineFacts {
        os: os.into(),
        gpus,
        nvml: if nvml {
            NvmlStatus::Available {
                driver_version: "580.65".into(),
                cuda_driver_version: "13.0".into(),
            }
        } else {
            NvmlStatus::Unavailable("libnvidia-ml.so.1: cannot open shared object file".into())
        },
        libtorch_cuda,
        mps_available: mps,
        cpu: cpu(),
    }
}

/// A box where NVML and libtorch see the same GPUs, in the same order.
fn gpu_box(specs: &[(&str, u64, u64, (u32, u32))]) -> MachineFacts {
    let nvml: Vec<GpuFacts> = specs
        .iter()
        .enumerate()
        .map(|(i, (n, t, f, cc))| nvml_gpu(i as u32, n, *t, *f, *cc))
        .collect();
    let torch: Vec<TorchGpu> = nvml
        .iter()
        .enumerate()
        .map(|(i, g)| torch_gpu(i, g))
        .collect();
    machine(merge_gpu_views(Some(&nvml), &torch), true, "linux", false)
}

#[test]
fn auto_picks_the_only_gpu() {
    let m = gpu_box(&[("NVIDIA H100 80GB HBM3", 80, 79, (9, 0))]);
    let s = select(DeviceRequest::Auto, &m).unwrap();
    assert_eq!(s.device, Device::Cuda(0));
    assert!(
        s.reason
            .contains("the only CUDA GPU (NVIDIA H100 80GB HBM3, 79.0 of 80.0 GiB free)"),
        "{}",
        s.reason
    );
    assert_eq!(s.gpu.unwrap().source, GpuSource::Both);
}

#[test]
fn auto_picks_the_gpu_with_most_free_memory_on_a_multi_gpu_box() {
    let m = gpu_box(&[
        ("NVIDIA A100-SXM4-80GB", 80, 12, (8, 0)),
        ("NVIDIA A100-SXM4-80GB", 80, 70, (8, 0)),
        ("NVIDIA A100-SXM4-80GB", 80, 70, (8, 0)),
        ("NVIDIA A100-SXM4-80GB", 80, 3, (8, 0)),
    ]);
    let s = select(DeviceRequest::Auto, &m).unwrap();
    assert_eq!(s.device, Device::Cuda(1), "ties go to the lower index");
    assert!(s.reason.contains("most free memory of 4"), "{}", s.reason);
    assert_eq!(
        select(DeviceRequest::Cuda(None), &m).unwrap().device,
        Device::Cuda(1)
    );
    assert_eq!(
        select(DeviceRequest::Cuda(Some(3)), &m).unwrap().device,
        Device::Cuda(3)
    );
}

#[test]
fn an_index_beyond_the_gpus_lists_what_the_machine_has() {
    let m = gpu_box(&[("NVIDIA H100 80GB HBM3", 80, 79, (9, 0))]);
    let err = select(DeviceRequest::Cuda(Some(3)), &m).unwrap_err();
    assert!(matches!(err, SelectError::Unavailable { .. }));
    let msg = err.to_string();
    assert!(msg.contains("device `cuda:3` is not available"), "{msg}");
    assert!(msg.contains("this machine has 1 CUDA GPU(s)"), "{msg}");
    assert!(
        msg.contains("This machine has: cpu, cuda:0 (NVIDIA H100 80GB HBM3)"),
        "{msg}"
    );
}

#[test]
fn mps_on_linux_is_refused_with_the_alternatives() {
    let m = gpu_box(&[("NVIDIA GeForce RTX 4090", 24, 22, (8, 9))]);
    let msg = select(DeviceRequest::Mps, &m).unwrap_err().to_string();
    assert!(
        msg.contains("MPS exists only on Apple silicon Macs; this machine runs linux"),
        "{msg}"
    );
    assert!(
        msg.contains("cpu, cuda:0 (NVIDIA GeForce RTX 4090)"),
        "{msg}"
    );
}

#[test]
fn cuda_indices_follow_cuda_not_nvml_order() {
    // CUDA_VISIBLE_DEVICES=2,0: CUDA sees NVML's GPU 2 as cuda:0 and NVML's 0 as cuda:1;
    // NVML's GPU 1 is hidden from this process.
    let nvml = vec![
        nvml_gpu(0, "NVIDIA A100-SXM4-40GB", 40, 30, (8, 0)),
        nvml_gpu(1, "NVIDIA A100-SXM4-40GB", 40, 39, (8, 0)),
        nvml_gpu(2, "NVIDIA H100 80GB HBM3", 80, 60, (9, 0)),
    ];
    let torch = vec![torch_gpu(0, &nvml[2]), torch_gpu(1, &nvml[0])];
    let gpus = merge_gpu_views(Some(&nvml), &torch);
    assert_eq!(gpus.len(), 3);
    assert_eq!((gpus[0].cuda_index, gpus[0].nvml_index), (Some(0), Some(2)));
    assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
    assert_eq!(
        gpus[0].free_memory_bytes,
        Some(60 * GIB),
        "NVML's live facts are kept"
    );
    assert_eq!((gpus[1].cuda_index, gpus[1].nvml_index), (Some(1), Some(0)));
    assert_eq!(
        (gpus[2].cuda_index, gpus[2].source),
        (None, GpuSource::NvmlOnly)
    );
    let m = machine(gpus, true, "linux", false);
    assert_eq!(
        select(DeviceRequest::Auto, &m).unwrap().device,
        Device::Cuda(0)
    );
    assert!(
        cuda_diagnosis(&m)
            .unwrap()
            .contains("hidden from this process")
    );
}

#[test]
fn without_nvml_libtorch_is_the_fallback_view() {
    let g = nvml_gpu(0, "NVIDIA L4", 24, 23, (8, 9));
    let gpus = merge_gpu_views(None, &[torch_gpu(0, &g)]);
    assert_eq!(gpus[0].source, GpuSource::LibtorchOnly);
    assert_eq!(gpus[0].free_memory_bytes, None);
    let m = machine(gpus, false, "linux", false);
    let s = select(DeviceRequest::Auto, &m).unwrap();
    assert_eq!(s.device, Device::Cuda(0));
    assert!(s.reason.contains("NVIDIA L4, 23.5 GiB"), "{}", s.reason);
}

#[test]
fn nvml_gpus_that_libtorch_cannot_use_are_diagnosed() {
    // The classic "the GPU is not detected": a driver and GPU, but libtorch says no CUDA.
    let nvml = vec![nvml_gpu(0, "NVIDIA H100 80GB HBM3", 80, 79, (9, 0))];
    let m = machine(merge_gpu_views(Some(&nvml), &[]), true, "linux", false);
    let s = select(DeviceRequest::Auto, &m).unwrap();
    assert_eq!(s.device, Device::Cpu);
    assert!(
        s.reason.contains("NVML sees 1 GPU(s) libtorch cannot use"),
        "{}",
        s.reason
    );
    assert!(s.reason.contains("CPU build"), "{}", s.reason);
    let msg = select(DeviceRequest::Cuda(None), &m)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("NVML sees 1 GPU(s)") && msg.contains("This machine has: cpu"),
        "{msg}"
    );
}

#[test]
fn cpu_only_machines_use_the_cpu_and_say_why() {
    let m = machine(vec![], false, "linux", false);
    let s = select(DeviceRequest::Auto, &m).unwrap();
    assert_eq!(s.device, Device::Cpu);
    assert!(
        s.reason
            .contains("no CUDA GPU found (NVML: libnvidia-ml.so.1"),
        "{}",
        s.reason
    );
    assert_eq!(select(DeviceRequest::Cpu, &m).unwrap().device, Device::Cpu);
    let msg = select(DeviceRequest::Cuda(Some(0)), &m)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("This machine has: cpu"), "{msg}");
    assert_eq!(available_devices(&m), "cpu");
}

#[test]
fn macs_use_mps_when_available() {
    let mac = machine(vec![], false, "macos", true);
    let s = select(DeviceRequest::Auto, &mac).unwrap();
    assert_eq!(s.device, Device::Mps);
    assert_eq!(
        select(DeviceRequest::Mps, &mac).unwrap().device,
        Device::Mps
    );
    let intel_mac = machine(vec![], false, "macos", false);
    let msg = select(DeviceRequest::Mps, &intel_mac)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("needs Apple silicon and macOS 12.3+"), "{msg}");
}

#[test]
fn this_machine_probes_and_selects() {
    let facts = kiln_device::probe::probe().unwrap();
    let s = select(DeviceRequest::Auto, &facts).unwrap();
    eprintln!(
        "this machine: {} GPU(s); auto -> {} ({})",
        facts.gpus.len(),
        s.device,
        s.reason
    );
    if facts.cuda_gpus().next().is_none() {
        assert_eq!(s.device, Device::Cpu);
    } else {
        assert!(matches!(s.device, Device::Cuda(_)));
    }
}
