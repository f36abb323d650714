//! Free space on a file system, asked before a large write (`statvfs`, through `rustix`), and
//! [`NoSpace`], the error of a write that does not fit: the path, the bytes it needs and the
//! bytes free. kiln's writers that stage a directory and rename it into place (datasets,
//! checkpoints) check first and, should a write still fail for want of space, remove what
//! they staged and report this same error.

use std::path::{Path, PathBuf};

/// A write that does not fit on its file system.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct NoSpace {
    /// What was to be written (the directory a dataset or a checkpoint would have become).
    pub path: PathBuf,
    /// What it is, for the message ("the checkpoint", "the dataset").
    pub what: &'static str,
    /// Bytes the write needs (an estimate, in whole blocks of the file system); 0 where the
    /// writer could not tell.
    pub needed: u64,
    /// Bytes free for it (`statvfs`'s `f_bavail`), after anything staged was removed.
    pub available: u64,
    /// What the user can do.
    pub hint: &'static str,
}

impl NoSpace {
    fn describe(&self) -> String {
        let needs = match self.needed {
            0 => "more than the file system holding it has".to_owned(),
            n => format!(
                "about {} and the file system holding it has {}",
                amount(n),
                amount(self.available)
            ),
        };
        let free = match self.needed {
            0 => format!(" ({} free)", amount(self.available)),
            _ => " free".to_owned(),
        };
        format!(
            "{}: not enough free space for {}: it needs {needs}{free}; nothing was left \
             half-written. {}",
            self.path.display(),
            self.what,
            self.hint
        )
    }
}

/// "1.4 MiB (1441792 bytes)".
fn amount(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} bytes"),
        _ => format!("{value:.1} {} ({bytes} bytes)", UNITS[unit]),
    }
}

/// The room on a file system: bytes free to an unprivileged writer, and the block size that
/// files take up space in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub available: u64,
    pub block: u64,
}

/// The room on the file system that holds `path` (or, where `path` does not exist yet, its
/// nearest existing ancestor); `None` where the system cannot tell.
pub fn free(path: &Path) -> Option<Space> {
    let existing = path.ancestors().find(|p| p.exists())?;
    let existing = if existing.as_os_str().is_empty() {
        Path::new(".")
    } else {
        existing
    };
    statvfs(existing)
}

#[cfg(unix)]
fn statvfs(path: &Path) -> Option<Space> {
    let s = rustix::fs::statvfs(path).ok()?;
    let block = if s.f_frsize > 0 {
        s.f_frsize
    } else {
        s.f_bsize
    };
    Some(Space {
        available: s.f_bavail.saturating_mul(block),
        block: block.max(1),
    })
}

#[cfg(not(unix))]
fn statvfs(_path: &Path) -> Option<Space> {
    None
}

/// Bytes that files of these lengths take in a new directory on a file system of `block`-byte
/// blocks: each file rounded up to whole blocks, and a block for the directory.
pub fn needed(files: impl IntoIterator<Item = u64>, block: u64) -> u64 {
    let block = block.max(1);
    files
        .into_iter()
        .map(|len| len.div_ceil(block).saturating_mul(block))
        .fold(block, u64::saturating_add)
}

/// Whether an I/O error says the file system (or the user's quota on it) is full.
pub fn is_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

impl NoSpace {
    /// Checks that files of lengths `files` fit, in a new directory, on the file system that
    /// will hold `path`; the error names `path`. Passes where the system cannot tell the space.
    pub fn check(
        path: &Path,
        files: &[u64],
        what: &'static str,
        hint: &'static str,
    ) -> Result<(), NoSpace> {
        let Some(space) = free(path) else {
            return Ok(());
        };
        let needed = needed(files.iter().copied(), space.block);
        if needed <= space.available {
            return Ok(());
        }
        Err(NoSpace {
            path: path.to_owned(),
            what,
            needed,
            available: space.available,
            hint,
        })
    }

    /// This error about `path`, with the space free there now (after a failed write's files
    /// were removed).
    pub fn at(self, path: &Path) -> NoSpace {
        NoSpace {
            available: free(path).map_or(self.available, |s| s.available),
            path: path.to_owned(),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_take_whole_blocks_and_the_directory_one_more() {
        assert_eq!(needed([], 4096), 4096);
        assert_eq!(needed([1], 4096), 8192);
        assert_eq!(needed([4096, 4097, 0], 4096), 4096 + 4096 + 8192);
        assert_eq!(needed([10, 20], 1), 31);
        // A block size of 0 (a file system that does not say) counts bytes.
        assert_eq!(needed([10], 0), 11);
        assert_eq!(needed([u64::MAX, 5], 4096), u64::MAX);
    }

    #[test]
    fn the_error_names_the_path_and_both_amounts() {
        let e = NoSpace {
            path: PathBuf::from("/mnt/small/out"),
            what: "the dataset",
            needed: 3 * 1024 * 1024,
            available: 512,
            hint: "Free some space.",
        };
        assert_eq!(
            e.to_string(),
            "/mnt/small/out: not enough free space for the dataset: it needs about 3.0 MiB \
             (3145728 bytes) and the file system holding it has 512 bytes free; nothing was \
             left half-written. Free some space."
        );
    }

    #[test]
    fn full_file_systems_and_quotas_are_told_from_other_faults() {
        // ENOSPC is 28 on Linux and macOS; EDQUOT is Linux's 122.
        assert!(is_full(&std::io::Error::from_raw_os_error(28)));
        if cfg!(target_os = "linux") {
            assert!(is_full(&std::io::Error::from_raw_os_error(122)));
        }
        assert!(!is_full(&std::io::Error::from_raw_os_error(13)));
    }

    #[test]
    fn a_path_not_made_yet_is_measured_at_its_nearest_ancestor() {
        let tmp = tempfile::tempdir().unwrap();
        let deep = tmp.path().join("a/b/c");
        let space = free(&deep).expect("statvfs answers for a temporary directory");
        assert!(space.block > 0);
        assert!(NoSpace::check(&deep, &[1], "x", "").is_ok());
        let e = NoSpace::check(&deep, &[u64::MAX / 2], "the dataset", "h").unwrap_err();
        assert_eq!(e.path, deep);
        assert!(e.needed > e.available);
    }
}
