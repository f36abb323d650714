//! Text and JSON reports of what kiln found and decided.

use std::fmt::Write;

use kiln_config::{Layer, Resolution};
use kiln_device::libtorch::{CudaLibraryState, LibtorchInfo};
use kiln_device::select::{available_devices, cuda_diagnosis};
use kiln_device::{GpuSource, NvmlStatus};
use kiln_profiles::{Basis, Profile, ProfileSet, Resolved};
use serde_json::{Value, json};

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

pub fn version(info: &LibtorchInfo) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "kiln {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(s, "libtorch {} at {}", info.version, info.lib_dir.display());
    let _ = writeln!(s, "libtorch_cuda: {}", cuda_library(info.cuda_library));
    let _ = writeln!(
        s,
        "CUDA available: {} ({} device(s))",
        yes_no(info.cuda_available),
        info.cuda_device_count
    );
    let _ = writeln!(
        s,
        "data-parallel: Gloo (CPU){}",
        if kiln_torch_ext::dist::nccl_available() {
            ", NCCL (CUDA)"
        } else {
            "; NCCL not built (no NCCL/CUDA headers when kiln was built)"
        }
    );
    let _ = writeln!(s, "onnxruntime: {}", onnxruntime());
    s
}

/// The ONNX Runtime `.onnx` models run in: its version, build and library, or why there is none.
fn onnxruntime() -> String {
    match kiln_infer::onnx::runtime() {
        Ok(rt) => format!("{} at {}", rt.describe(), rt.library.display()),
        Err(e) => format!("not available: {e}"),
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn cuda_library(state: CudaLibraryState) -> &'static str {
    match state {
        CudaLibraryState::NotShipped => "not shipped (CPU build)",
        CudaLibraryState::Linked => "linked",
        CudaLibraryState::LoadedAtRuntime => "loaded at run time",
    }
}

fn basis(r: &Resolved) -> String {
    match &r.basis {
        Basis::Matched { pattern } => format!("matched by `{pattern}`"),
        Basis::Derived { nearest } => format!("derived (nearest profile by memory: {nearest})"),
        Basis::Device => "the device's profile".to_owned(),
        Basis::Named => "named in the configuration".to_owned(),
    }
}

/// The run's first log line: device, profile and the values that matter, with their sources.
/// Where a value came from, in a few words, for the start lines.
fn short_source(plan: &kiln_config::RunPlan, key: &str) -> String {
    plan.source_of(key)
        .map_or("?".to_owned(), |p| match p.layer {
            Layer::Default => "default".to_owned(),
            Layer::Profile => "profile".to_owned(),
            Layer::Checkpoint => "checkpoint".to_owned(),
            Layer::File => "file".to_owned(),
            Layer::Env => p
                .source
                .trim_start_matches("environment variable ")
                .to_owned(),
            Layer::CommandLine => p.source.trim_start_matches("command line ").to_owned(),
        })
}

/// The training settings of a run with their sources, printed when training starts.
pub fn train_line(r: &Resolution) -> String {
    let plan = &r.plan;
    let values: std::collections::BTreeMap<&str, String> = plan.entries().into_iter().collect();
    [
        "model.name",
        "train.epochs",
        "train.lr",
        "train.optimizer",
        "train.schedule",
        "train.grad_accum_steps",
        "train.clip_grad_norm",
        "performance.intra_op_threads",
    ]
    .iter()
    .map(|key| {
        format!(
            "{} {} [{}]",
            key.split('.').nth(1).unwrap_or(key),
            values.get(key).map_or("?", String::as_str),
            short_source(plan, key)
        )
    })
    .collect::<Vec<_>>()
    .join(" · ")
}

pub fn start_line(r: &Resolution) -> String {
    let plan = &r.plan;
    let src = |key: &str| short_source(plan, key);
    let device = match &r.selection.gpu {
        Some(g) => format!("{} ({})", r.selection.device, g.name),
        None => r.selection.device.to_string(),
    };
    format!(
        "device {device} · profile {} ({}) · batch_size {} [{}] · amp {} [{}] · workers {} [{}] · tf32 {} [{}]",
        r.profile.profile.name,
        basis(&r.profile),
        if plan.train.batch_size_auto {
            format!("auto (search from {})", plan.train.batch_size)
        } else {
            plan.train.batch_size.to_string()
        },
        src("train.batch_size"),
        plan.train.amp,
        src("train.amp"),
        if plan.data.num_workers_auto {
            format!("auto (0 to {})", plan.data.num_workers)
        } else {
            plan.data.num_workers.to_string()
        },
        src("data.num_workers"),
        plan.performance.backend.tf32,
        src("performance.tf32"),
    )
}

pub fn doctor_text(info: &LibtorchInfo, r: Result<&Resolution, &anyhow::Error>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "kiln {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(s, "\nlibtorch");
    let _ = writeln!(s, "  version        {}", info.version);
    let _ = writeln!(s, "  library        {}", info.lib_dir.display());
    let _ = writeln!(s, "  libtorch_cuda  {}", cuda_library(info.cuda_library));
    let _ = writeln!(
        s,
        "  compiled with  CUDA {}, cuDNN {}",
        info.cuda_compiled.as_deref().unwrap_or("-"),
        info.cudnn_compiled.as_deref().unwrap_or("-")
    );
    let _ = writeln!(
        s,
        "  sees CUDA      {} ({} device(s)); kiln's native CUDA part: {}",
        yes_no(info.cuda_available),
        info.cuda_device_count,
        if info.native_cuda {
            "built"
        } else {
            "not built"
        }
    );
    let Ok(r) = r else {
        let _ = writeln!(
            s,
            "\nconfiguration\n  ERROR: {:#}",
            r.err().map(|e| e.to_string()).unwrap_or_default()
        );
        return s;
    };
    let facts = &r.facts;
    let _ = writeln!(s, "\nNVML");
    match &facts.nvml {
        NvmlStatus::Available {
            driver_version,
            cuda_driver_version,
        } => {
            let _ = writeln!(
                s,
                "  driver {driver_version}, supports CUDA up to {cuda_driver_version}"
            );
        }
        NvmlStatus::Unavailable(why) => {
            let _ = writeln!(s, "  unavailable: {why}");
        }
    }
    let _ = writeln!(s, "\nGPUs ({})", facts.gpus.len());
    if facts.gpus.is_empty() {
        let _ = writeln!(s, "  none");
    }
    for g in &facts.gpus {
        let cuda = g
            .cuda_index
            .map_or("not visible to libtorch".to_owned(), |i| {
                format!("cuda:{i}")
            });
        let free = g.free_memory_bytes.map_or(String::new(), |f| {
            format!(", {:.1} GiB free", f as f64 / GIB)
        });
        let _ = writeln!(
            s,
            "  {cuda:<8} {} — {:.1} GiB{free}, compute capability {}{}",
            g.name,
            g.memory_gib(),
            g.compute_capability,
            match g.source {
                GpuSource::Both => "",
                GpuSource::NvmlOnly => " [NVML only]",
                GpuSource::LibtorchOnly => " [libtorch only]",
            }
        );
        let mut live = vec![];
        if let Some(u) = g.utilization_percent {
            live.push(format!("{u}% busy"));
        }
        if let Some(t) = g.temperature_celsius {
            live.push(format!("{t} °C"));
        }
        if let Some(p) = g.power_watts {
            live.push(format!("{p:.0} W"));
        }
        if !live.is_empty() {
            let _ = writeln!(s, "           {}", live.join(", "));
        }
    }
    if let Some(diagnosis) = cuda_diagnosis(facts) {
        let _ = writeln!(s, "  PROBLEM: {diagnosis}");
    }
    let c = &facts.cpu;
    let _ = writeln!(s, "\nCPU");
    let _ = writeln!(s, "  model          {}", c.model);
    let _ = writeln!(
        s,
        "  cores          {} physical, {} usable",
        c.physical_cores, c.logical_cores
    );
    let _ = writeln!(
        s,
        "  memory         {:.1} GiB, {:.1} GiB available",
        c.total_memory_bytes as f64 / GIB,
        c.available_memory_bytes as f64 / GIB
    );
    let _ = writeln!(
        s,
        "  bf16 units     AMX-BF16 {}, AVX512-BF16 {} (AVX-512 {})",
        yes_no(c.amx_bf16),
        yes_no(c.avx512_bf16),
        yes_no(c.avx512)
    );
    let _ = writeln!(s, "\nthis run");
    let _ = writeln!(s, "  devices        {}", available_devices(facts));
    let _ = writeln!(
        s,
        "  selected       {} ({}: {})",
        r.selection.device, r.plan.device_request, r.selection.reason
    );
    let _ = writeln!(
        s,
        "  profile        {} — {} ({})",
        r.profile.profile.name,
        basis(&r.profile),
        r.profile.profile.origin
    );
    for a in &r.profile.adjustments {
        let _ = writeln!(
            s,
            "  adjusted       {}: {} → {} ({})",
            a.key, a.from, a.to, a.reason
        );
    }
    let _ = writeln!(s, "  start line     {}", start_line(r));
    s
}

pub fn doctor_json(info: &LibtorchInfo, r: Result<&Resolution, String>) -> Value {
    let mut v = json!({
        "kiln_version": env!("CARGO_PKG_VERSION"),
        "libtorch": info,
    });
    match r {
        Ok(r) => {
            v["machine"] = serde_json::to_value(&r.facts).unwrap_or(Value::Null);
            v["cuda_diagnosis"] = json!(cuda_diagnosis(&r.facts));
            v["selection"] = serde_json::to_value(&r.selection).unwrap_or(Value::Null);
            v["profile"] = resolved_json(&r.profile.profile.display_name, &r.profile);
        }
        Err(e) => v["error"] = json!(e),
    }
    v
}

pub fn profile_list(set: &ProfileSet) -> String {
    let mut s = format!(
        "{:<12} {:<26} {:<5} {:>6} {:>6} {:>7} {:>6} {:<5} {}\n",
        "NAME", "DISPLAY NAME", "DEV", "TRAIN", "INFER", "WORKERS", "MEM", "AMP", "MATCHES"
    );
    for p in set.all() {
        let patterns: Vec<&str> = p.patterns.iter().map(|x| x.text.as_str()).collect();
        let _ = writeln!(
            s,
            "{:<12} {:<26} {:<5} {:>6} {:>6} {:>7} {:>6.2} {:<5} {}",
            p.name,
            p.display_name,
            p.device,
            p.train_batch_size,
            p.infer_batch_size,
            p.num_workers,
            p.memory_fraction,
            p.amp_dtype,
            if patterns.is_empty() {
                "-".to_owned()
            } else {
                patterns.join(", ")
            }
        );
    }
    s
}

pub fn profile_json(p: &Profile) -> Value {
    json!({
        "name": p.name,
        "display_name": p.display_name,
        "device": p.device.to_string(),
        "match": p.patterns.iter().map(|x| x.text.clone()).collect::<Vec<_>>(),
        "memory_gib": p.memory_gib,
        "compute_capability": p.compute_capability.to_string(),
        "train_batch_size": p.train_batch_size,
        "infer_batch_size": p.infer_batch_size,
        "sliding_window_batch_size": p.sliding_window_batch_size,
        "num_workers": p.num_workers,
        "memory_fraction": p.memory_fraction,
        "amp_dtype": p.amp_dtype.to_string(),
        "tf32": p.tf32,
        "matmul_precision": p.matmul_precision.to_string(),
        "cudnn_benchmark": p.cudnn_benchmark,
        "cudnn_deterministic": p.cudnn_deterministic,
        "notes": p.notes,
        "origin": p.origin.to_string(),
    })
}

pub fn profile_text(p: &Profile) -> String {
    let mut s = String::new();
    let v = profile_json(p);
    let _ = writeln!(s, "{} — {} ({})", p.name, p.display_name, p.origin);
    for (k, val) in v.as_object().into_iter().flatten() {
        if !matches!(k.as_str(), "name" | "display_name" | "origin") {
            let _ = writeln!(s, "  {k:<20} {}", val.to_string().trim_matches('"'));
        }
    }
    s
}

pub fn resolved_json(gpu: &str, r: &Resolved) -> Value {
    json!({
        "gpu": gpu,
        "basis": basis(r),
        "profile": profile_json(&r.profile),
        "adjustments": r.adjustments.iter().map(|a| json!({
            "key": a.key, "from": a.from, "to": a.to, "reason": a.reason,
        })).collect::<Vec<_>>(),
    })
}

pub fn resolved_text(gpu: &str, r: &Resolved) -> String {
    let mut s = format!("{gpu} → profile {} ({})\n", r.profile.name, basis(r));
    for a in &r.adjustments {
        let _ = writeln!(
            s,
            "  adjusted {}: {} → {} ({})",
            a.key, a.from, a.to, a.reason
        );
    }
    s.push_str(&profile_text(&r.profile));
    s
}

fn layer_name(layer: Layer) -> &'static str {
    match layer {
        Layer::Default => "default",
        Layer::Profile => "profile",
        Layer::Checkpoint => "checkpoint",
        Layer::File => "file",
        Layer::Env => "env",
        Layer::CommandLine => "command line",
    }
}

/// The plan as text; `shown` replaces a key's value where what it resolves to is known
/// only on this machine (`train.lr = auto`'s cached answer).
pub fn plan_text(r: &Resolution, explain: bool, shown: &[(&str, String)]) -> String {
    let mut s = String::new();
    let gpu = r
        .selection
        .gpu
        .as_ref()
        .map_or(String::new(), |g| format!(" ({})", g.name));
    let _ = writeln!(
        s,
        "# device {}{gpu}: {}",
        r.selection.device, r.selection.reason
    );
    let _ = writeln!(
        s,
        "# profile {}: {} ({})",
        r.profile.profile.name,
        basis(&r.profile),
        r.profile.profile.origin
    );
    let entries = r.plan.entries();
    let width = entries.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in entries {
        let value = shown
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(value, |(_, v)| v.clone());
        if explain {
            let p = r.plan.source_of(key);
            let layer = p.map_or("?", |p| layer_name(p.layer));
            let source = p.map_or(String::new(), |p| p.source.clone());
            let note = p
                .and_then(|p| p.note.clone())
                .map_or(String::new(), |n| format!(" — {n}"));
            let _ = writeln!(s, "{key:<width$} = {value:<12} [{layer}] {source}{note}");
        } else {
            let _ = writeln!(s, "{key} = {value}");
        }
    }
    s
}

pub fn plan_json(r: &Resolution) -> Value {
    let values: serde_json::Map<String, Value> = r
        .plan
        .entries()
        .into_iter()
        .map(|(key, value)| {
            let p = r.plan.source_of(key);
            (
                key.to_owned(),
                json!({
                    "value": value,
                    "layer": p.map(|p| layer_name(p.layer)),
                    "source": p.map(|p| p.source.clone()),
                    "note": p.and_then(|p| p.note.clone()),
                }),
            )
        })
        .collect();
    json!({
        "device": r.selection.device.to_string(),
        "device_reason": r.selection.reason,
        "gpu": r.selection.gpu.as_ref().map(|g| g.name.clone()),
        "profile": resolved_json(&r.profile.profile.display_name, &r.profile),
        "values": values,
    })
}
