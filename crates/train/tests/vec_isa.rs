//! The compiler script remembers Inductor's vector-ISA probes: with the memo, Inductor picks the
//! same instruction sets (and the same AVX-512 BF16 flag) as with its own probes, and a warm memo
//! answers without probing at all.

mod common;

use std::path::Path;
use std::process::Command;

/// What Inductor finds in one fresh Python: the valid vector ISAs with their compiler flags.
/// `memo` installs the script's memo first; `broken_probe` makes every probe that still runs fail.
const PROBE: &str = r#"
import importlib.util, json, sys
script, memo, broken_probe = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
spec = importlib.util.spec_from_file_location("compile_program", script)
compile_program = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compile_program)
from torch._inductor import cpu_vec_isa
if broken_probe:
    cpu_vec_isa.VecISA._avx_py_load = "raise SystemExit(1)"
if memo:
    compile_program.remember_vec_isa_checks()
print(json.dumps([[str(i), i.build_arch_flags()] for i in cpu_vec_isa.valid_vec_isa_list()]))
"#;

fn valid_isas(script: &Path, cache: &Path, memo: bool, broken_probe: bool) -> serde_json::Value {
    let flag = |b: bool| if b { "1" } else { "0" };
    let out = Command::new(common::python_with_torch())
        .args(["-c", PROBE])
        .arg(script)
        .args([flag(memo), flag(broken_probe)])
        .env("TORCHINDUCTOR_CACHE_DIR", cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"))
}

#[test]
#[ignore = "needs Python with torch 2.11 (KILN_PYTHON) and a C++ compiler; `cargo xtask test` runs it"]
fn remembered_vec_isa_probes_pick_what_inductors_probes_pick_with_python_torch() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/compile_program.py");
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("inductor");
    // A cold memo probes as Inductor does (and records what passed).
    let probed = valid_isas(&script, &cache, true, false);
    assert!(
        probed.as_array().is_some_and(|a| !a.is_empty()),
        "Inductor found no vector ISA here, so the memo cannot be checked: {probed}"
    );
    // Broken probes find nothing: what follows can tell a remembered answer from a probe.
    assert_eq!(
        valid_isas(&script, &cache, false, true),
        serde_json::json!([])
    );
    let memo = cache.join("kiln-vec-isa.json");
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&memo).unwrap()).unwrap();
    assert!(kept.as_object().is_some_and(|m| !m.is_empty()), "{kept}");
    // A warm memo answers alone, even with every probe broken.
    assert_eq!(valid_isas(&script, &cache, true, true), probed);
}
