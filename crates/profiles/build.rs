//! Build script of kiln-profiles: embeds every `profiles/*.toml` of the repository into the
//! crate, so the `kiln` binary carries its profiles wherever it is copied. The crate does not
//! link libtorch.

use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../profiles");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the repository's profiles/ directory exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    let mut code = String::from("/// (file name, contents) of every built-in profile.\n");
    code.push_str("pub(crate) const BUILTIN: &[(&str, &str)] = &[\n");
    for path in &files {
        let path = path.canonicalize().expect("profile path resolves");
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        code.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("builtin_profiles.rs");
    std::fs::write(out, code).expect("OUT_DIR is writable");
}
