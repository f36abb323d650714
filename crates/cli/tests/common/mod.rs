//! What the CLI tests share: running the `kiln` binary as a user would, and its output as text.

use std::process::{Command, Output};

/// Runs `kiln args…` with no library path, log filter or device request from this environment.
pub fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("RUST_LOG")
        .env_remove("KILN_DEVICE__REQUEST")
        .output()
        .expect("the kiln binary runs")
}

#[allow(dead_code)] // not every test binary reads stdout as text
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
