//! Small shared helpers for xtask: the error type, repository paths and process spawning.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

/// An xtask failure: a message meant for a person, already saying what to do.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Error(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Error(s.to_owned())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Builds an [`Error`] from a format string and returns it.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::util::Error(format!($($arg)*)))
    };
}
pub(crate) use bail;

/// The repository root (the directory holding the workspace `Cargo.toml`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the repository root")
        .to_path_buf()
}

/// The `cargo` that started us (so a rustup toolchain override is respected).
pub fn cargo() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// `text` in bold (with `color`, an SGR code such as "1;31") when stderr is a terminal.
pub fn styled(text: &str, color: &str) -> String {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        format!("\x1b[{color}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

/// Prints a step banner the way the other steps do.
pub fn step(msg: &str) {
    eprintln!("{} {msg}", styled("==>", "1"));
}

/// Prints an informational line from xtask.
pub fn info(msg: &str) {
    eprintln!("xtask: {msg}");
}

/// Runs `cmd` with inherited stdio and returns its exit status, or an error naming the program.
pub fn status_of(cmd: &mut Command) -> Result<ExitStatus> {
    cmd.status().map_err(|e| {
        Error(format!(
            "could not start `{}`: {e}",
            cmd.get_program().to_string_lossy()
        ))
    })
}

/// Describes an exit status for an error message ("exit code 101", "killed by signal 9").
pub fn describe_status(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exit code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return format!("killed by signal {sig}");
        }
    }
    "terminated abnormally".to_owned()
}

/// Free space in bytes on the filesystem holding `path` (or its nearest existing ancestor).
///
/// Uses POSIX `df -Pk`, so xtask needs no libc binding; `None` when it cannot tell.
pub fn free_bytes(path: &Path) -> Option<u64> {
    let mut probe = path;
    while !probe.exists() {
        probe = probe.parent()?;
    }
    let out = Command::new("df").arg("-Pk").arg(probe).output().ok()?;
    if !out.status.success() {
        return None;
    }
    parse_df_available_kib(&String::from_utf8_lossy(&out.stdout)).map(|kib| kib * 1024)
}

/// Parses the "Available" column (in KiB) of `df -Pk` output.
pub fn parse_df_available_kib(output: &str) -> Option<u64> {
    let line = output.lines().nth(1)?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Formats a byte count for people: "4.6 GB".
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn df_available_column_is_parsed() {
        let out = "Filesystem     1024-blocks      Used Available Capacity Mounted on\n\
                   /dev/vda         263174212  11534336  83886080      12% /\n";
        assert_eq!(parse_df_available_kib(out), Some(83_886_080));
        assert_eq!(parse_df_available_kib("Filesystem\n"), None);
        assert_eq!(parse_df_available_kib(""), None);
    }

    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(4_600_000_000), "4.6 GB");
        assert_eq!(human_bytes(2_700_000_000), "2.7 GB");
        assert_eq!(human_bytes(1_500_000), "1.5 MB");
    }

    #[test]
    fn free_bytes_finds_an_existing_ancestor() {
        let missing = std::env::temp_dir().join("kiln-xtask-does-not-exist/a/b");
        let free = free_bytes(&missing).expect("df works on the temp dir");
        assert!(free > 0);
    }
}
