//! Applying backend settings for a CPU run: what applies is applied (and read back from
//! libtorch), what does not apply to the CPU says so. One test: the settings are process-wide.

use kiln_device::Device;
use kiln_device::settings::{BackendSettings, Determinism, MatmulPrecision, Outcome, apply};
use kiln_torch_ext::{flags, memory};

#[test]
fn a_cpu_run_applies_what_it_can_and_reports_the_rest() {
    let settings = BackendSettings {
        tf32: true,
        matmul_precision: MatmulPrecision::High,
        cudnn_benchmark: true,
        cudnn_deterministic: false,
        deterministic: Determinism::Warn,
        memory_fraction: 0.8,
        intra_op_threads: 1,
        inter_op_threads: 0,
        seed: 1234,
        malloc_tuning: false,
    };
    let report = apply(&settings, Device::Cpu);
    let outcome = |name: &str| {
        report
            .iter()
            .find(|r| r.setting == name)
            .unwrap_or_else(|| panic!("{name} missing from {report:?}"))
            .outcome
            .clone()
    };
    assert_eq!(outcome("matmul_precision"), Outcome::Applied);
    assert_eq!(
        flags::float32_matmul_precision().unwrap(),
        MatmulPrecision::High
    );
    assert_eq!(outcome("deterministic"), Outcome::Applied);
    assert_eq!(
        flags::deterministic_algorithms().unwrap(),
        Determinism::Warn
    );
    assert_eq!(outcome("intra_op_threads"), Outcome::Applied);
    assert_eq!(memory::num_threads().unwrap().0, 1);
    for cuda_only in [
        "tf32 (cuBLAS)",
        "tf32 (cuDNN)",
        "cudnn_benchmark",
        "memory_fraction",
    ] {
        match outcome(cuda_only) {
            Outcome::NotApplicable(why) => assert!(why.contains("this run uses cpu"), "{why}"),
            other => panic!("{cuda_only} on the CPU: {other:?}"),
        }
    }
    assert!(matches!(
        outcome("inter_op_threads"),
        Outcome::NotApplicable(_)
    ));
    // Off, the C allocator is left alone (its effect is tests/malloc.rs's).
    match outcome("malloc_tuning") {
        Outcome::NotApplicable(why) => assert!(why.contains("as it is"), "{why}"),
        other => panic!("malloc_tuning = false: {other:?}"),
    }

    // The seed is applied: the same seed gives the same numbers.
    let a = tch::Tensor::randn([4], (tch::Kind::Float, tch::Device::Cpu));
    apply(&settings, Device::Cpu);
    let b = tch::Tensor::randn([4], (tch::Kind::Float, tch::Device::Cpu));
    assert!(a.equal(&b));

    let mem = kiln_device::memory::report(Device::Cpu, None).unwrap();
    let (available, total) = mem.host_available_total.unwrap();
    assert!(total >= available);
    kiln_device::memory::empty_cache(Device::Cpu).unwrap();
}
