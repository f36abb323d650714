//! gpu-check steps about the runtime: the doctor's findings, backend flags read back, the
//! memory fraction honoured, and the allocator's statistics and empty cache.

use anyhow::Context;
use kiln_config::{ConfigRequest, Machine};
use kiln_device::facts::{GpuSource, NvmlStatus};
use kiln_device::settings::{self, Outcome as Applied};
use kiln_torch_ext::flags::{self, Flag, MatmulPrecision};
use kiln_torch_ext::{cuda, memory};
use serde_json::json;
use tch::{Kind, Tensor};

use super::{Ctx, GIB, Outcome};

/// libtorch and its CUDA library, NVML, and the two GPU lists joined by UUID.
pub fn doctor(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let info = kiln_device::libtorch::libtorch_info()?;
    let r = kiln_config::load(&ConfigRequest::new(Machine::Probed(
        kiln_device::probe::probe()?,
    )))?;
    let facts = &r.facts;
    let nvml = match &facts.nvml {
        NvmlStatus::Available { driver_version, .. } => format!("driver {driver_version}"),
        NvmlStatus::Unavailable(why) => format!("unavailable ({why})"),
    };
    let gpus: Vec<_> = facts
        .gpus
        .iter()
        .map(|g| {
            json!({"name": g.name, "uuid": g.uuid, "cuda_index": g.cuda_index,
                        "nvml_index": g.nvml_index, "seen_by": format!("{:?}", g.source)})
        })
        .collect();
    let unjoined: Vec<&str> = facts
        .gpus
        .iter()
        .filter(|g| g.source != GpuSource::Both)
        .map(|g| g.name.as_str())
        .collect();
    let nvml_only = facts.gpus.iter().any(|g| g.source == GpuSource::NvmlOnly);
    let base = |pass: bool, summary: String| {
        Outcome::new(pass, summary)
            .figure("libtorch", info.version.clone())
            .figure("libtorch_lib_dir", info.lib_dir.display().to_string())
            .figure("cuda_library", format!("{:?}", info.cuda_library))
            .figure("native_cuda", info.native_cuda)
            .figure("cuda_devices", info.cuda_device_count as u64)
            .figure("nvml", nvml.clone())
            .figure("gpus", json!(gpus))
            .figure(
                "selected",
                format!("{}: {}", r.selection.device, r.selection.reason),
            )
    };
    if nvml_only {
        return Ok(base(
            false,
            format!(
                "NVML sees GPUs that libtorch cannot use: {}",
                r.selection.reason
            ),
        ));
    }
    if !ctx.cuda() {
        return Ok(base(
            true,
            format!(
                "libtorch {}; no CUDA device; NVML {nvml}; a run uses the CPU",
                info.version
            ),
        ));
    }
    let joined = unjoined.is_empty() && !facts.gpus.is_empty();
    let selected_cuda = matches!(r.selection.device, kiln_device::Device::Cuda(_));
    let pass = joined && info.native_cuda && selected_cuda;
    Ok(base(
        pass,
        format!(
            "libtorch {} with CUDA {}; {} GPU(s) joined by UUID{}; native CUDA {}; selected {}",
            info.version,
            info.cuda_compiled.as_deref().unwrap_or("?"),
            facts.gpus.len(),
            if unjoined.is_empty() {
                String::new()
            } else {
                format!(" (not joined: {unjoined:?})")
            },
            if info.native_cuda {
                "compiled in"
            } else {
                "MISSING"
            },
            r.selection.device
        ),
    ))
}

/// Sets the backend flags to the opposite of libtorch's defaults, reads each back, and restores.
pub fn backend_flags(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let device = if ctx.cuda() {
        kiln_device::Device::Cuda(0)
    } else {
        kiln_device::Device::Cpu
    };
    let wanted = settings::BackendSettings {
        tf32: true,
        matmul_precision: MatmulPrecision::High,
        cudnn_benchmark: true,
        cudnn_deterministic: false,
        deterministic: flags::Determinism::Off,
        memory_fraction: 0.9,
        intra_op_threads: 0,
        inter_op_threads: 0,
        seed: 0,
        malloc_tuning: true,
    };
    let applied = settings::apply(&wanted, device);
    let failed: Vec<_> = applied
        .iter()
        .filter(|a| matches!(a.outcome, Applied::Failed(_)))
        .map(|a| format!("{}: {:?}", a.setting, a.outcome))
        .collect();
    let mut mismatches = vec![];
    let precision = flags::float32_matmul_precision()?;
    if precision != MatmulPrecision::High {
        mismatches.push(format!("matmul precision reads {precision:?}, set High"));
    }
    if ctx.cuda() {
        for flag in [Flag::Tf32CuBlas, Flag::Tf32CuDnn, Flag::CuDnnBenchmark] {
            if !flags::flag(flag)? {
                mismatches.push(format!("{flag:?} reads false, set true"));
            }
        }
    }
    let applied_n = applied
        .iter()
        .filter(|a| a.outcome == Applied::Applied)
        .count();
    let pass = failed.is_empty() && mismatches.is_empty();
    let summary = if pass {
        format!(
            "{applied_n} settings applied and read back{}",
            if ctx.cuda() {
                " (TF32 cuBLAS/cuDNN, cudnn.benchmark, matmul precision)"
            } else {
                " (CUDA flags not applicable on the CPU)"
            }
        )
    } else {
        format!("failed: {failed:?}; read back wrong: {mismatches:?}")
    };
    Ok(Outcome::new(pass, summary).figure("applied", json!(applied)))
}

/// Bytes of an f32 tensor of `bytes`, allocated on cuda:0 (an error when it does not fit).
fn allocate(bytes: u64) -> anyhow::Result<Tensor> {
    let n = i64::try_from(bytes / 4)?;
    Ok(Tensor::f_empty([n], (Kind::Float, tch::Device::Cuda(0)))?.f_fill_(1.0)?)
}

/// A memory fraction set before the first allocation: an allocation under it succeeds, one
/// past it fails with out-of-memory (and the process goes on).
pub fn memory_fraction(_ctx: &Ctx) -> anyhow::Result<Outcome> {
    let total = cuda::device_properties(0)?.total_memory_bytes;
    let fraction = 0.05;
    cuda::set_memory_fraction(fraction, 0)?;
    let limit = (total as f64 * fraction) as u64;
    let below = allocate(limit / 2).context("an allocation of half the fraction failed")?;
    drop(below);
    memory::empty_cache()?;
    let past = allocate(limit + limit / 2);
    let oom = match &past {
        Err(e) => e
            .downcast_ref::<tch::TchError>()
            .is_some_and(kiln_torch_ext::tch_out_of_memory),
        Ok(_) => false,
    };
    let after = allocate(limit / 4).is_ok();
    let pass = oom && after;
    Ok(Outcome::new(
        pass,
        format!(
            "fraction {fraction} of {:.0} GiB: {:.2} GiB allocated, {:.2} GiB {}; afterwards {}",
            total as f64 / GIB,
            (limit / 2) as f64 / GIB,
            (limit + limit / 2) as f64 / GIB,
            if oom {
                "refused with out-of-memory"
            } else {
                "NOT refused as out-of-memory"
            },
            if after {
                "allocations work again"
            } else {
                "allocations FAIL"
            }
        ),
    )
    .figure("fraction", fraction)
    .figure("limit_gib", limit as f64 / GIB)
    .figure(
        "past_limit_error",
        past.err().map_or("none".to_owned(), |e| first_line(&e)),
    ))
}

/// Allocated/reserved statistics follow an allocation, its release and an empty cache.
pub fn memory_stats(_ctx: &Ctx) -> anyhow::Result<Outcome> {
    let mib = |b: u64| b as f64 / 1048576.0;
    let before = memory::stats(0)?;
    let size = 256u64 << 20;
    let t = allocate(size)?;
    let held = memory::stats(0)?;
    drop(t);
    let freed = memory::stats(0)?;
    memory::empty_cache()?;
    let emptied = memory::stats(0)?;
    memory::reset_peak(0)?;
    let reset = memory::stats(0)?;
    let grew = held.allocated >= before.allocated + size;
    let released = freed.allocated + size <= held.allocated && freed.reserved >= size;
    let returned = emptied.reserved + size <= freed.reserved;
    let peak_reset = reset.allocated_peak < held.allocated_peak;
    let pass = grew && released && returned && peak_reset;
    Ok(Outcome::new(
        pass,
        format!(
            "256 MiB tensor: allocated {:.0}→{:.0}→{:.0} MiB, reserved {:.0}→{:.0} MiB after empty \
             cache; peak reset {}",
            mib(before.allocated),
            mib(held.allocated),
            mib(freed.allocated),
            mib(freed.reserved),
            mib(emptied.reserved),
            if peak_reset {
                "works"
            } else {
                "did NOT lower the peak"
            }
        ),
    )
    .figure("allocated_held_mib", mib(held.allocated))
    .figure("allocated_peak_mib", mib(held.allocated_peak))
    .figure("reserved_before_empty_mib", mib(freed.reserved))
    .figure("reserved_after_empty_mib", mib(emptied.reserved))
    .figure("grew", grew)
    .figure("released", released)
    .figure("returned_to_driver", returned))
}

pub fn first_line(e: &anyhow::Error) -> String {
    e.to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(200)
        .collect()
}
