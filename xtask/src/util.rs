//! Small shared helpers for xtask: the error type, repository paths, process spawning, pinned
//! `pip install --target` directories and the small JSON records xtask leaves for kiln.

use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::Instant;

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

/// Prints a warning from xtask: something did not work, and the command goes on without it.
pub fn warn(msg: &str) {
    eprintln!("xtask: {} {msg}", styled("warning:", "1;33"));
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

/// The exit code that passes on a child's `status` (1 where its code does not fit, or it had
/// none: then why, naming the child as `what`, is said).
pub fn exit_code_of(status: ExitStatus, what: &str) -> ExitCode {
    match status.code() {
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => {
            info(&format!("{what} was {}", describe_status(status)));
            ExitCode::FAILURE
        }
    }
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

/// Writes `bytes` to a temporary file beside `path` (named after this process, so two xtasks
/// never share one), syncs it, then renames it into place.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error(format!("cannot write {}: {e}", path.display()))
    })
}

/// Writes `text` to `path` (atomically) unless the file already holds exactly that; returns
/// whether it wrote.
pub fn write_if_changed(path: &Path, text: &str) -> Result<bool> {
    if fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)
            .map_err(|e| Error(format!("cannot create {}: {e}", parent.display())))?;
    }
    write_atomically(path, text.as_bytes())?;
    Ok(true)
}

// ---- Small JSON records (xtask has no serde) ----

/// A JSON object of string values, one key per line, ending in a newline.
pub fn json_object(pairs: &[(&str, &str)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("  {}: {}", json_string(k), json_string(v)))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Reads a JSON object whose values are all strings (what [`json_object`] writes); `None` for
/// anything else. kiln reads these records with serde and xtask only writes them, so this
/// reader is for tests: it checks that what xtask writes is JSON and reads back the same.
#[cfg(test)]
pub fn parse_json_object(text: &str) -> Option<Vec<(String, String)>> {
    let mut chars = text.trim().chars().peekable();
    let skip_ws = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
    };
    if chars.next()? != '{' {
        return None;
    }
    let mut pairs = vec![];
    skip_ws(&mut chars);
    if chars.next_if_eq(&'}').is_some() {
        return chars.next().is_none().then_some(pairs);
    }
    loop {
        skip_ws(&mut chars);
        let key = parse_json_str(&mut chars)?;
        skip_ws(&mut chars);
        if chars.next()? != ':' {
            return None;
        }
        skip_ws(&mut chars);
        let value = parse_json_str(&mut chars)?;
        pairs.push((key, value));
        skip_ws(&mut chars);
        match chars.next()? {
            ',' => continue,
            '}' => return chars.next().is_none().then_some(pairs),
            _ => return None,
        }
    }
}

#[cfg(test)]
fn parse_json_str(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Option<String> {
    if chars.next()? != '"' {
        return None;
    }
    let mut out = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                '/' => out.push('/'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    let unit = u32::from_str_radix(&hex, 16).ok()?;
                    let code = if (0xd800..0xdc00).contains(&unit) {
                        // A surrogate pair: the low half must follow as another \u escape.
                        if chars.next()? != '\\' || chars.next()? != 'u' {
                            return None;
                        }
                        let hex: String = chars.by_ref().take(4).collect();
                        let low = u32::from_str_radix(&hex, 16).ok()?;
                        0x10000 + ((unit - 0xd800) << 10) + low.checked_sub(0xdc00)?
                    } else {
                        unit
                    };
                    out.push(char::from_u32(code)?);
                }
                _ => return None,
            },
            c if u32::from(c) < 0x20 => return None,
            c => out.push(c),
        }
    }
}

/// `path` as UTF-8 for a JSON record (kiln reads these records, and JSON holds only text).
pub fn utf8_path(path: &Path) -> Result<&str> {
    path.to_str().ok_or_else(|| {
        Error(format!(
            "{} is not valid UTF-8, so it cannot be recorded for kiln; set KILN_CACHE_DIR to a \
             path that is",
            path.display()
        ))
    })
}

// ---- Pinned `pip install --target` directories (bench peers, onnxruntime, export packages) ----

/// What a Python says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PythonFacts {
    /// `sys.executable`: an absolute path, even when the Python was named by a bare command.
    pub executable: PathBuf,
    /// `sys.version` (wheels differ between Python versions).
    pub version: String,
}

impl PythonFacts {
    /// `(major, minor)` read from [`Self::version`].
    pub fn major_minor(&self) -> Option<(u32, u32)> {
        let number = self.version.split_whitespace().next()?;
        let mut parts = number.split('.').map(str::parse::<u32>);
        Some((parts.next()?.ok()?, parts.next()?.ok()?))
    }
}

pub fn python_facts(python: &Path) -> Result<PythonFacts> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sys; print(sys.executable); print(sys.version)",
        ])
        .output()
        .map_err(|e| Error(format!("cannot run {}: {e}", python.display())))?;
    if !out.status.success() {
        bail!(
            "{} -c 'import sys' failed ({})",
            python.display(),
            describe_status(out.status)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let executable = lines.next().map(str::trim).unwrap_or_default();
    let version = lines.collect::<Vec<_>>().join("\n").trim().to_owned();
    if executable.is_empty() || version.is_empty() {
        bail!(
            "{} did not answer like a Python 3 interpreter",
            python.display()
        );
    }
    Ok(PythonFacts {
        executable: PathBuf::from(executable),
        version,
    })
}

/// A pinned set of wheels that pip installs into a directory of its own with
/// `pip install --no-deps --only-binary :all: --target`: pip resolves nothing, builds nothing and
/// never touches the Python's own packages (torch above all).
///
/// The directory is `<base>/<name>`; pip writes into `<base>/<name>.partial`, which is renamed
/// once the install is checked, and a marker holding `key` is written into it last, so a
/// finished install is a no-op and an interrupted or outdated one is redone. `<base>/<name>.lock`
/// lets one installer run at a time; pip's output goes to `<base>/<name>.log`.
#[derive(Debug)]
pub struct PinnedInstall<'a> {
    /// The Python whose pip installs (the wheels are chosen for its version).
    pub python: &'a Path,
    pub base: PathBuf,
    pub name: String,
    /// What the install is for: the marker must hold exactly this.
    pub key: String,
    /// The marker's file name inside the directory.
    pub marker: &'static str,
    /// For messages: "onnxruntime 1.31.1 (cpu build)".
    pub what: String,
    /// What pip installs: `name==version`s, or `--requirement FILE`.
    pub packages: Vec<OsString>,
}

/// A finished [`PinnedInstall`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub dir: PathBuf,
    /// Whether this call installed it (rather than finding it done).
    pub installed_now: bool,
}

impl PinnedInstall<'_> {
    pub fn dir(&self) -> PathBuf {
        self.base.join(&self.name)
    }

    fn sibling(&self, ext: &str) -> PathBuf {
        self.base.join(format!("{}.{ext}", self.name))
    }

    /// Whether a finished install for this key is there.
    pub fn is_ready(&self) -> bool {
        fs::read_to_string(self.dir().join(self.marker)).is_ok_and(|k| k == self.key)
    }

    /// Installs unless already done. `check` inspects the unfinished directory (given the log
    /// path too) before it becomes the final one; its error fails the install.
    pub fn ensure(&self, check: impl FnOnce(&Path, &Path) -> Result<()>) -> Result<Installed> {
        let dir = self.dir();
        let done = Installed {
            dir: dir.clone(),
            installed_now: false,
        };
        if self.is_ready() {
            return Ok(done);
        }
        // Before anything is created: a Python without pip cannot install anything.
        self.check_pip()?;
        fs::create_dir_all(&self.base)
            .map_err(|e| Error(format!("cannot create {}: {e}", self.base.display())))?;
        let lock_path = self.sibling("lock");
        let lock = fs::File::create(&lock_path)
            .map_err(|e| Error(format!("cannot create {}: {e}", lock_path.display())))?;
        if lock.try_lock().is_err() {
            info(&format!(
                "another xtask is installing {}; waiting for it to finish",
                self.what
            ));
            lock.lock()
                .map_err(|e| Error(format!("cannot lock {}: {e}", lock_path.display())))?;
        }
        if self.is_ready() {
            return Ok(done);
        }
        let partial = self.sibling("partial");
        let log = self.sibling("log");
        for old in [&partial, &dir] {
            if old.exists() {
                fs::remove_dir_all(old)
                    .map_err(|e| Error(format!("cannot remove {}: {e}", old.display())))?;
            }
        }
        step(&format!(
            "installing {} into {} (once; log: {})",
            self.what,
            dir.display(),
            log.display()
        ));
        let started = Instant::now();
        let mut pip = Command::new(self.python);
        pip.args([
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--only-binary",
            ":all:",
        ])
        .args([
            "--disable-pip-version-check",
            "--no-input",
            "--retries",
            "2",
        ])
        .arg("--target")
        .arg(&partial)
        .args(&self.packages);
        logged(pip, &log, &format!("pip install of {}", self.what))?;
        check(&partial, &log)?;
        fs::rename(&partial, &dir).map_err(|e| {
            Error(format!(
                "cannot rename {} to {}: {e}",
                partial.display(),
                dir.display()
            ))
        })?;
        fs::write(dir.join(self.marker), &self.key)
            .map_err(|e| Error(format!("cannot write {}: {e}", dir.display())))?;
        info(&format!(
            "{} installed in {:.0} s",
            self.what,
            started.elapsed().as_secs_f64()
        ));
        Ok(Installed {
            dir,
            installed_now: true,
        })
    }

    fn check_pip(&self) -> Result<()> {
        let out = Command::new(self.python)
            .args(["-m", "pip", "--version"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error(format!("cannot run {}: {e}", self.python.display())))?;
        if out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("pip ") {
            return Ok(());
        }
        bail!(
            "{} cannot run pip (`-m pip --version` {}); install {} with a Python that has pip",
            self.python.display(),
            if out.status.success() {
                "did not answer like pip".to_owned()
            } else {
                format!("failed with {}", describe_status(out.status))
            },
            self.what
        )
    }
}

/// Runs `cmd` with its output appended to `log`; on failure, an error naming the cause (a
/// network error, a full disk, else pip's last `ERROR:` line, which names the package) and
/// pointing at the log.
pub fn logged(mut cmd: Command, log: &Path, what: &str) -> Result<()> {
    let out = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| Error(format!("cannot open {}: {e}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(|e| Error(format!("{}: {e}", log.display())))?;
    let status = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .status()
        .map_err(|e| Error(format!("cannot run {what}: {e}")))?;
    if status.success() {
        return Ok(());
    }
    let text = fs::read_to_string(log).unwrap_or_default();
    bail!(
        "{what} failed ({}): {} (full log: {})",
        describe_status(status),
        pip_failure_cause(&text)
            .or_else(|| last_error(&text))
            .unwrap_or("no ERROR line; see the log"),
        log.display()
    )
}

/// Whether a pip log says the disk is full.
pub fn pip_disk_full(log: &str) -> bool {
    ["No space left on device", "[Errno 28]"]
        .iter()
        .any(|s| log.contains(s))
}

/// Whether a pip log says PyPI could not be reached.
pub fn pip_offline(log: &str) -> bool {
    [
        "NewConnectionError",
        "Failed to establish a new connection",
        "Temporary failure in name resolution",
        "Name or service not known",
        "Network is unreachable",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ProxyError",
        "Connection refused",
    ]
    .iter()
    .any(|s| log.contains(s))
}

/// What a pip log says went wrong when it is not the package's fault: the network or the disk.
pub fn pip_failure_cause(log: &str) -> Option<&'static str> {
    if pip_disk_full(log) {
        return Some(
            "the disk is full; free some space, or set KILN_CACHE_DIR to a disk with room",
        );
    }
    if pip_offline(log) {
        return Some(
            "PyPI could not be reached (a network error); check the connection or proxy (pip \
             honours HTTPS_PROXY and PIP_INDEX_URL)",
        );
    }
    None
}

/// The last line of pip's (or Python's) output that says what failed: `ERROR: …`, or the
/// exception line at the end of a traceback (`ModuleNotFoundError: …`).
pub fn last_error(log: &str) -> Option<&str> {
    log.lines().rev().map(str::trim).find(|l| {
        l.starts_with("ERROR:")
            || l.split_once(':').is_some_and(|(head, _)| {
                head.ends_with("Error") && !head.is_empty() && !head.contains(char::is_whitespace)
            })
            || (l.starts_with("AssertionError"))
    })
}

/// 64-bit FNV-1a (xtask has no dependencies; this only names cache directories).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
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

    #[test]
    fn fnv1a_is_the_reference_hash() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn pip_errors_are_found_and_diagnosed() {
        let log = "Collecting lightning==2.6.6\n  WARNING: Retrying\n\
                   ERROR: Could not find a version that satisfies the requirement \
                   lightning==2.6.6 (from versions: none)\n\
                   ERROR: No matching distribution found for lightning==2.6.6\n";
        assert_eq!(
            last_error(log),
            Some("ERROR: No matching distribution found for lightning==2.6.6")
        );
        assert_eq!(pip_failure_cause(log), None);
        assert_eq!(last_error("all fine\nnote: nothing failed\n"), None);
        let traceback = "Traceback (most recent call last):\n  File \"<string>\", line 1\n\
                         ModuleNotFoundError: No module named 'typing_extensions'\n";
        assert_eq!(
            last_error(traceback),
            Some("ModuleNotFoundError: No module named 'typing_extensions'")
        );
        let net = "WARNING: Retrying ... NewConnectionError('Failed to establish a new \
                   connection: [Errno -3] Temporary failure in name resolution')\n\
                   ERROR: No matching distribution found for onnxruntime==1.31.1";
        assert!(
            pip_failure_cause(net)
                .unwrap()
                .contains("PyPI could not be reached")
        );
        let disk = "ERROR: Could not install packages due to an OSError: [Errno 28] No space";
        assert!(pip_failure_cause(disk).unwrap().contains("disk is full"));
    }

    #[test]
    fn python_versions_are_read() {
        let facts = PythonFacts {
            executable: PathBuf::from("/venv/bin/python"),
            version: "3.11.7 (main, May  9 2026, 07:35:25) [GCC 12.2.0]".to_owned(),
        };
        assert_eq!(facts.major_minor(), Some((3, 11)));
        let odd = PythonFacts {
            version: "PyPy".to_owned(),
            ..facts
        };
        assert_eq!(odd.major_minor(), None);
    }

    #[test]
    fn json_records_round_trip() {
        let tricky = "/ca\"che/\\x\ty\u{1}z/é🦀";
        let text = json_object(&[("library", tricky), ("version", "1.31.1")]);
        assert!(text.starts_with("{\n  \"library\": \"/ca\\\"che/\\\\x\\ty\\u0001z/é🦀\",\n"));
        assert!(text.ends_with("}\n"));
        assert_eq!(
            parse_json_object(&text).unwrap(),
            [
                ("library".to_owned(), tricky.to_owned()),
                ("version".to_owned(), "1.31.1".to_owned())
            ]
        );
        assert_eq!(
            parse_json_object(r#"{"a":"\ud83e\udd80\/"}"#).unwrap(),
            [("a".to_owned(), "🦀/".to_owned())]
        );
        assert_eq!(parse_json_object("{}"), Some(vec![]));
        for bad in [
            "",
            "{",
            r#"{"a": 1}"#,
            r#"{"a": "b",}"#,
            r#"{"a": "b"} x"#,
            "[]",
        ] {
            assert_eq!(parse_json_object(bad), None, "{bad}");
        }
    }

    #[test]
    fn records_are_written_atomically_and_only_when_changed() {
        let dir = std::env::temp_dir().join(format!("kiln-xtask-util-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let path = dir.join("sub/record.json");
        assert!(write_if_changed(&path, "one\n").unwrap());
        assert!(!write_if_changed(&path, "one\n").unwrap());
        assert!(write_if_changed(&path, "two\n").unwrap());
        assert_eq!(fs::read_to_string(&path).unwrap(), "two\n");
        let names: Vec<_> = fs::read_dir(dir.join("sub")).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
        fs::remove_dir_all(&dir).unwrap();
    }
}
