//! Backend settings a run applies to libtorch: the plain settings and precision enums (from
//! `kiln-core`, re-exported here) and [`apply`], which sets them and reports each one.

pub use kiln_core::settings::{AmpDtype, BackendSettings, Determinism, MatmulPrecision};

/// What happened to one setting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "snake_case")]
pub enum Outcome {
    Applied,
    /// The setting has nothing to act on for this device; it was left alone.
    NotApplicable(String),
    /// libtorch refused it.
    Failed(String),
}

/// One line of the apply report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AppliedSetting {
    pub setting: &'static str,
    pub value: String,
    pub outcome: Outcome,
}

/// Applies `settings` for a run on `device` and reports each setting's outcome.
pub fn apply(settings: &BackendSettings, device: crate::Device) -> Vec<AppliedSetting> {
    use kiln_torch_ext::{cuda, flags, memory};
    let is_cuda = matches!(device, crate::Device::Cuda(_));
    let mut report = Vec::new();
    let mut record = |setting: &'static str, value: String, outcome: Outcome| {
        report.push(AppliedSetting {
            setting,
            value,
            outcome,
        });
    };
    let done = |r: kiln_torch_ext::Result<()>| match r {
        Ok(()) => Outcome::Applied,
        Err(e) => Outcome::Failed(e.to_string()),
    };
    let cuda_only = |what: &str| {
        Outcome::NotApplicable(format!(
            "{what} is a CUDA setting and this run uses {device}"
        ))
    };

    record(
        "matmul_precision",
        settings.matmul_precision.to_string(),
        done(flags::set_float32_matmul_precision(
            settings.matmul_precision,
        )),
    );
    for (name, flag, value) in [
        ("tf32 (cuBLAS)", flags::Flag::Tf32CuBlas, settings.tf32),
        ("tf32 (cuDNN)", flags::Flag::Tf32CuDnn, settings.tf32),
        (
            "cudnn_benchmark",
            flags::Flag::CuDnnBenchmark,
            settings.cudnn_benchmark,
        ),
        (
            "cudnn_deterministic",
            flags::Flag::CuDnnDeterministic,
            settings.cudnn_deterministic,
        ),
    ] {
        let outcome = if is_cuda {
            done(flags::set_flag(flag, value))
        } else {
            cuda_only(name)
        };
        record(name, value.to_string(), outcome);
    }
    record(
        "deterministic",
        settings.deterministic.to_string(),
        done(flags::set_deterministic_algorithms(settings.deterministic)),
    );
    let fraction = settings.memory_fraction.to_string();
    match device {
        crate::Device::Cuda(i) => record(
            "memory_fraction",
            fraction,
            done(cuda::set_memory_fraction(settings.memory_fraction, i)),
        ),
        _ => record("memory_fraction", fraction, cuda_only("memory_fraction")),
    }
    for (name, n, set) in [
        (
            "intra_op_threads",
            settings.intra_op_threads,
            memory::set_num_threads as fn(usize) -> kiln_torch_ext::Result<()>,
        ),
        (
            "inter_op_threads",
            settings.inter_op_threads,
            memory::set_num_interop_threads,
        ),
    ] {
        let outcome = if n == 0 {
            Outcome::NotApplicable("0 keeps libtorch's default".to_owned())
        } else {
            done(set(usize::try_from(n).unwrap_or(usize::MAX)))
        };
        record(name, n.to_string(), outcome);
    }
    {
        let _generator = kiln_torch_ext::rng::cpu_generator_lock();
        tch::manual_seed(i64::from_ne_bytes(settings.seed.to_ne_bytes()));
    }
    record("seed", settings.seed.to_string(), Outcome::Applied);
    record(
        "malloc_tuning",
        settings.malloc_tuning.to_string(),
        match settings.malloc_tuning {
            false => Outcome::NotApplicable("false leaves the C allocator as it is".to_owned()),
            true if !crate::malloc::SUPPORTED => {
                Outcome::NotApplicable("the C library is not glibc".to_owned())
            }
            true => match crate::malloc::keep_freed_memory() {
                Ok(()) => Outcome::Applied,
                Err(e) => Outcome::Failed(e),
            },
        },
    );
    report
}
