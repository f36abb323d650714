//! CPU and memory facts from `/proc/cpuinfo` and `/proc/meminfo` (Linux), with portable
//! fallbacks elsewhere.

use std::collections::BTreeSet;

use crate::facts::CpuFacts;

/// Model, cores and feature flags parsed from `/proc/cpuinfo` text.
pub fn parse_cpuinfo(text: &str) -> (String, usize, usize, BTreeSet<String>) {
    let mut model = String::new();
    let mut logical = 0;
    let mut cores = BTreeSet::new();
    let mut flags = BTreeSet::new();
    let (mut physical_id, mut core_id) = (None::<String>, None::<String>);
    for line in text.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let Some(core) = core_id.take() {
                cores.insert((physical_id.take().unwrap_or_default(), core));
            }
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => logical += 1,
            "model name" if model.is_empty() => model = value.to_owned(),
            "physical id" => physical_id = Some(value.to_owned()),
            "core id" => core_id = Some(value.to_owned()),
            "flags" if flags.is_empty() => {
                flags = value.split_whitespace().map(str::to_owned).collect();
            }
            _ => {}
        }
    }
    let physical = if cores.is_empty() {
        logical
    } else {
        cores.len()
    };
    (model, physical, logical, flags)
}

/// (MemTotal, MemAvailable) in bytes from `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> (u64, u64) {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim_start_matches(':').split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// Probes the CPU. Logical cores are the ones this process may use (affinity and cgroup
/// limits respected), so a 2-core container is 2 cores whatever the host has.
pub fn probe_cpu() -> CpuFacts {
    let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (model, physical, logical, flags) = std::fs::read_to_string("/proc/cpuinfo")
        .map(|t| parse_cpuinfo(&t))
        .unwrap_or_else(|_| (String::new(), usable, usable, BTreeSet::new()));
    let (total, available) = std::fs::read_to_string("/proc/meminfo")
        .map(|t| parse_meminfo(&t))
        .unwrap_or((0, 0));
    let logical_cores = usable.min(logical.max(1));
    CpuFacts {
        model: if model.is_empty() {
            std::env::consts::ARCH.to_owned()
        } else {
            model
        },
        physical_cores: physical.clamp(1, logical_cores),
        logical_cores,
        total_memory_bytes: total,
        available_memory_bytes: available,
        avx512: flags.contains("avx512f"),
        avx512_bf16: flags.contains("avx512_bf16"),
        amx_bf16: flags.contains("amx_bf16"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const XEON_2: &str = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) \
        Platinum 8481C CPU @ 2.70GHz\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu sse2 avx2 \
        avx512f avx512_bf16 amx_bf16 amx_tile\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) \
        Platinum 8481C CPU @ 2.70GHz\nphysical id\t: 0\ncore id\t\t: 0\nflags\t\t: fpu sse2 avx2 \
        avx512f avx512_bf16 amx_bf16 amx_tile\n\n";

    #[test]
    fn cpuinfo_gives_model_cores_and_bf16_flags() {
        let (model, physical, logical, flags) = parse_cpuinfo(XEON_2);
        assert_eq!(model, "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz");
        assert_eq!((physical, logical), (1, 2), "two hyperthreads of one core");
        assert!(flags.contains("amx_bf16") && flags.contains("avx512_bf16"));
    }

    #[test]
    fn cpuinfo_without_topology_counts_processors() {
        let arm = "processor\t: 0\nFeatures\t: fp asimd\n\nprocessor\t: 1\nFeatures\t: fp asimd\n";
        let (model, physical, logical, flags) = parse_cpuinfo(arm);
        assert_eq!((model.as_str(), physical, logical), ("", 2, 2));
        assert!(flags.is_empty());
    }

    #[test]
    fn meminfo_gives_total_and_available_bytes() {
        let text =
            "MemTotal:       24576000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(text), (24_576_000 * 1024, 20_000_000 * 1024));
        assert_eq!(parse_meminfo(""), (0, 0));
    }

    #[test]
    fn this_machine_is_probed_consistently() {
        let cpu = probe_cpu();
        assert!(cpu.logical_cores >= 1);
        assert!(cpu.physical_cores >= 1 && cpu.physical_cores <= cpu.logical_cores);
        assert_eq!(cpu.has_fast_bf16(), cpu.amx_bf16 || cpu.avx512_bf16);
        if cfg!(target_os = "linux") {
            assert!(cpu.total_memory_bytes >= cpu.available_memory_bytes);
            assert!(cpu.total_memory_bytes > 0);
        }
    }
}
