//! Profile matching and resolution on real NVML names of every profiled GPU, unknown GPUs,
//! CPUs with and without bf16 units, and bad or conflicting profile files.

use kiln_core::settings::{AmpDtype, MatmulPrecision};
use kiln_core::{ComputeCapability, CpuFacts, Device, GpuFacts, GpuSource, Selection};
use kiln_profiles::{
    Basis, DEFAULT_SLIDING_WINDOW_BATCH, Origin, Profile, ProfileError, ProfileSet, resolve,
};

const GIB: u64 = 1 << 30;

fn set() -> ProfileSet {
    ProfileSet::builtin().expect("the built-in profiles are valid")
}

fn cpu(cores: usize, bf16: bool) -> CpuFacts {
    CpuFacts {
        model: "test cpu".into(),
        physical_cores: cores,
        logical_cores: cores,
        total_memory_bytes: 64 * GIB,
        available_memory_bytes: 60 * GIB,
        avx512: bf16,
        avx512_bf16: bf16,
        amx_bf16: bf16,
    }
}

fn gpu(name: &str, memory_gib: u64, cc: (u32, u32)) -> GpuFacts {
    GpuFacts {
        cuda_index: Some(0),
        nvml_index: Some(0),
        name: name.into(),
        uuid: None,
        total_memory_bytes: memory_gib * GIB,
        free_memory_bytes: Some(memory_gib * GIB),
        compute_capability: ComputeCapability::new(cc.0, cc.1),
        utilization_percent: None,
        temperature_celsius: None,
        power_watts: None,
        source: GpuSource::Both,
    }
}

fn on_gpu(g: GpuFacts) -> Selection {
    Selection {
        device: Device::Cuda(0),
        gpu: Some(g),
        reason: "test".into(),
    }
}

/// Real NVML names (as `nvidia-smi -L` prints them) and the profile each must get.
const REAL_NAMES: &[(&str, &str)] = &[
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("Tesla V100-SXM2-32GB", "v100"),
    ("Tesla V100-PCIE-16GB", "v100"),
    ("Tesla V100S-PCIE-32GB", "v100s-none"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 3090", "rtx3090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", "a10"),
    ("Tesla T4", "t4"),
];

#[test]
fn every_profiled_gpu_matches_its_profile_by_its_real_nvml_name() {
    let set = set();
    for (name, expected) in REAL_NAMES {
        let got = set
            .match_gpu(name)
            .unwrap()
            .map(|m| m.profile.name.as_str());
        if expected.ends_with("-none") {
            assert_eq!(got, None, "{name} must not match anything");
        } else {
            assert_eq!(got, Some(*expected), "{name}");
        }
    }
}

#[test]
fn near_names_do_not_match_the_wrong_profile() {
    let set = set();
    for name in [
        "NVIDIA L40",
        "NVIDIA GeForce RTX 4080",
        "NVIDIA A40",
        "NVIDIA A30",
        "NVIDIA GeForce RTX 3080",
    ] {
        assert!(set.match_gpu(name).unwrap().is_none(), "{name}");
    }
}

#[test]
fn seed_values_are_the_starting_point() {
    let set = set();
    let h100 = set.get("h100").unwrap();
    assert_eq!(
        (
            h100.train_batch_size,
            h100.infer_batch_size,
            h100.num_workers
        ),
        (256, 1024, 32)
    );
    assert_eq!(h100.matmul_precision, MatmulPrecision::High);
    let h200 = set.get("h200").unwrap();
    assert_eq!((h200.train_batch_size, h200.infer_batch_size), (512, 2048));
    let v100 = set.get("v100").unwrap();
    assert!(v100.cudnn_deterministic && !v100.tf32);
    assert_eq!(v100.amp_dtype, AmpDtype::Fp16);
    let r4090 = set.get("rtx4090").unwrap();
    assert_eq!((r4090.train_batch_size, r4090.memory_fraction), (32, 0.85));
    assert_eq!(r4090.matmul_precision, MatmulPrecision::Medium);
    let cpu = set.get("generic-cpu").unwrap();
    assert_eq!(
        (
            cpu.train_batch_size,
            cpu.infer_batch_size,
            cpu.num_workers,
            cpu.memory_fraction
        ),
        (16, 64, 4, 0.75)
    );
    assert!(matches!(&cpu.origin, Origin::BuiltIn(f) if f == "generic-cpu.toml"));
}

/// Windows per batch of sliding-window inference: by the device's memory, 4 on the CPU; a
/// user's file written before the field existed still parses, with the default.
#[test]
fn sliding_window_batches_follow_the_device_and_default_to_four() {
    let set = set();
    let windows = |name: &str| set.get(name).unwrap().sliding_window_batch_size;
    assert_eq!(
        ["generic-cpu", "t4", "h100", "h200"].map(windows),
        [4, 8, 16, 32]
    );
    let h100 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/h100.toml"
    ))
    .unwrap();
    let older = h100.replace("sliding_window_batch_size = 16", "");
    assert_ne!(older, h100);
    let parsed = Profile::parse(&older, Origin::User("old.toml".into())).unwrap();
    assert_eq!(
        parsed.sliding_window_batch_size,
        DEFAULT_SLIDING_WINDOW_BATCH
    );
    let zero = h100.replace(
        "sliding_window_batch_size = 16",
        "sliding_window_batch_size = 0",
    );
    let err = Profile::parse(&zero, Origin::User("z.toml".into())).unwrap_err();
    assert!(
        err.to_string()
            .contains("`sliding_window_batch_size` must be at least 1"),
        "{err}"
    );
}

#[test]
fn h100_resolves_as_matched_with_workers_capped_by_cores() {
    let r = resolve(
        &set(),
        &on_gpu(gpu("NVIDIA H100 80GB HBM3", 80, (9, 0))),
        &cpu(16, false),
        None,
    )
    .unwrap();
    assert_eq!(r.profile.name, "h100");
    assert_eq!(
        r.basis,
        Basis::Matched {
            pattern: "H100".into()
        }
    );
    assert_eq!(r.profile.num_workers, 16, "32 in the table, 16 cores here");
    assert_eq!(r.adjustments.len(), 1);
    assert_eq!(r.adjustments[0].key, "num_workers");
    assert!(r.adjustments[0].reason.contains("16 CPU core(s)"));
}

#[test]
fn a_profile_value_the_hardware_cannot_do_is_corrected_with_a_reason() {
    // A user profile asking bf16 and TF32 of a V100 (7.0): corrected to fp16, no TF32.
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/v100.toml"
    ))
    .unwrap()
    .replace("amp_dtype = \"fp16\"", "amp_dtype = \"bf16\"")
    .replace("tf32 = false", "tf32 = true")
    .replace(
        "matmul_precision = \"highest\"",
        "matmul_precision = \"high\"",
    );
    let v100 = Profile::parse(&text, Origin::User("v100.toml".into())).unwrap();
    let mut profiles: Vec<Profile> = set()
        .all()
        .iter()
        .filter(|p| p.name != "v100")
        .cloned()
        .collect();
    profiles.push(v100);
    let set = ProfileSet::from_profiles(profiles).unwrap();
    let r = resolve(
        &set,
        &on_gpu(gpu("Tesla V100-SXM2-32GB", 32, (7, 0))),
        &cpu(64, false),
        None,
    )
    .unwrap();
    assert_eq!(r.profile.amp_dtype, AmpDtype::Fp16);
    assert!(!r.profile.tf32);
    assert_eq!(r.profile.matmul_precision, MatmulPrecision::Highest);
    let keys: Vec<_> = r.adjustments.iter().map(|a| a.key).collect();
    assert_eq!(keys, ["amp_dtype", "tf32", "matmul_precision"]);
    assert!(r.adjustments[0].reason.contains("7.0 has no bf16"));
}

#[test]
fn an_unknown_gpu_gets_a_profile_derived_from_its_facts() {
    // An A40 (48 GB, 8.6): nearest by memory is the L40S table.
    let r = resolve(
        &set(),
        &on_gpu(gpu("NVIDIA A40", 48, (8, 6))),
        &cpu(8, false),
        None,
    )
    .unwrap();
    assert_eq!(
        r.basis,
        Basis::Derived {
            nearest: "l40s".into()
        }
    );
    assert_eq!(r.profile.origin, Origin::Derived);
    assert_eq!(r.profile.amp_dtype, AmpDtype::Bf16);
    assert!(r.profile.tf32);
    assert_eq!(r.profile.train_batch_size, 64);
    assert!(r.profile.num_workers <= 8);
    // A 12 GB Pascal card (6.1): no tensor cores, so no AMP and no TF32; batch scaled down.
    let r = resolve(
        &set(),
        &on_gpu(gpu("NVIDIA TITAN Xp", 12, (6, 1))),
        &cpu(8, false),
        None,
    )
    .unwrap();
    assert_eq!(r.profile.amp_dtype, AmpDtype::None);
    assert!(!r.profile.tf32);
    assert_eq!(r.profile.matmul_precision, MatmulPrecision::Highest);
    assert!(r.profile.train_batch_size < 32 && r.profile.train_batch_size >= 1);
    assert!(r.profile.notes.contains("scaled from"));
}

#[test]
fn cpu_profile_chooses_bf16_only_where_the_cpu_has_bf16_units() {
    let sel = Selection {
        device: Device::Cpu,
        gpu: None,
        reason: "test".into(),
    };
    let with = resolve(&set(), &sel, &cpu(2, true), None).unwrap();
    assert_eq!(with.profile.amp_dtype, AmpDtype::Bf16);
    assert!(
        with.adjustments
            .iter()
            .any(|a| a.key == "amp_dtype" && a.reason.contains("AMX-BF16"))
    );
    assert_eq!(
        with.profile.num_workers, 2,
        "4 in the table, never more than the 2 cores"
    );
    let without = resolve(&set(), &sel, &cpu(8, false), None).unwrap();
    assert_eq!(without.profile.amp_dtype, AmpDtype::None);
    assert_eq!(without.profile.num_workers, 4);
}

#[test]
fn unknown_profile_names_suggest_the_closest() {
    let err = set().get("rtx490").unwrap_err().to_string();
    assert!(
        err.contains("no profile is named `rtx490` (did you mean `rtx4090`?)"),
        "{err}"
    );
    assert!(err.contains("known profiles: a10, a100"), "{err}");
}

#[test]
fn bad_profile_files_name_the_file_and_key() {
    let good = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/h100.toml"
    ))
    .unwrap();
    let origin = || Origin::User("/home/me/profiles/mine.toml".into());
    let err = Profile::parse(
        &good.replace("memory_fraction = 0.90", "memory_fraction = 1.5"),
        origin(),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "profile file /home/me/profiles/mine.toml: `memory_fraction` must be in (0, 1], got 1.5"
    );
    let err = Profile::parse(
        &good.replace("amp_dtype = \"bf16\"", "amp_dtype = \"fp8\""),
        origin(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("`amp_dtype` `fp8` is not an AMP dtype"),
        "{err}"
    );
    let err = Profile::parse(&format!("{good}\nbatchsize = 3\n"), origin()).unwrap_err();
    assert!(matches!(err, ProfileError::Parse { .. }));
    assert!(
        err.to_string().contains("unknown field `batchsize`"),
        "{err}"
    );
    let err = Profile::parse(
        &good.replace("train_batch_size = 256", "train_batch_size = 0"),
        origin(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("`train_batch_size` must be at least 1"),
        "{err}"
    );
}

#[test]
fn user_profiles_override_builtins_and_conflicts_are_refused() {
    let dir = std::env::temp_dir().join(format!("kiln-profiles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let h100 = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../profiles/h100.toml"
    ))
    .unwrap();
    std::fs::write(
        dir.join("h100.toml"),
        h100.replace("train_batch_size = 256", "train_batch_size = 384"),
    )
    .unwrap();
    let set = ProfileSet::with_user_dir(&dir).unwrap();
    let m = set.match_gpu("NVIDIA H100 80GB HBM3").unwrap().unwrap();
    assert_eq!(m.profile.train_batch_size, 384);
    assert!(matches!(&m.profile.origin, Origin::User(p) if p.ends_with("h100.toml")));

    // A new profile claiming H100 under another name would make matching ambiguous.
    let clash = h100.replace("name = \"h100\"", "name = \"my-h100\"");
    std::fs::write(dir.join("my-h100.toml"), clash).unwrap();
    let err = ProfileSet::with_user_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("both match GPU names by `H100`"), "{err}");

    // A more specific pattern is fine and wins for the GPUs it names.
    let nvl = h100
        .replace("name = \"h100\"", "name = \"h100-nvl\"")
        .replace("match = [\"H100\"]", "match = [\"H100 NVL\"]");
    std::fs::write(dir.join("my-h100.toml"), nvl).unwrap();
    let set = ProfileSet::with_user_dir(&dir).unwrap();
    assert_eq!(
        set.match_gpu("NVIDIA H100 NVL")
            .unwrap()
            .unwrap()
            .profile
            .name,
        "h100-nvl"
    );
    assert_eq!(
        set.match_gpu("NVIDIA H100 PCIe")
            .unwrap()
            .unwrap()
            .profile
            .name,
        "h100"
    );

    let err = ProfileSet::with_user_dir(&dir.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot read the profile directory"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
