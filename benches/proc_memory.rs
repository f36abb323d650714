//! Memory of a process tree on Linux: PSS and RSS summed over a process and its descendants
//! (`/proc/<pid>/smaps_rollup`, zero where unreadable); one process's RSS from its `status`.

use std::process::{Child, ExitStatus};
use std::time::Duration;

/// Memory of a process tree, in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Peak {
    pub pss: u64,
    pub rss: u64,
}

impl Peak {
    /// The larger of each figure, for tracking a peak over samples.
    pub fn max(self, other: Peak) -> Peak {
        Peak {
            pss: self.pss.max(other.pss),
            rss: self.rss.max(other.rss),
        }
    }
}

/// Bytes in MiB.
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

/// The bytes of the field `name` (e.g. `Rss:`, given in kB) of a `/proc` file's `text`.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let value = text.lines().find_map(|l| l.strip_prefix(name))?;
    Some(value.split_whitespace().next()?.parse::<u64>().ok()? * 1024)
}

/// Process `pid`'s `VmRSS` in bytes (`/proc/<pid>/status`); `None` where unreadable.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    kib_field(&status, "VmRSS:")
}

/// PSS and RSS of one process.
fn rollup(pid: u32) -> Peak {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name| kib_field(&text, name).unwrap_or(0);
    Peak {
        pss: field("Pss:"),
        rss: field("Rss:"),
    }
}

/// Current PSS and RSS of process `pid` and all its descendants, summed.
pub fn tree_memory(pid: u32) -> Peak {
    let mut sum = rollup(pid);
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"));
    for task in tasks.into_iter().flatten().flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            let below = tree_memory(child);
            sum.pss += below.pss;
            sum.rss += below.rss;
        }
    }
    sum
}

/// Waits for `child`, sampling its tree's memory every `every`: its exit status and peak.
pub fn peak_until_exit(child: &mut Child, every: Duration) -> crate::Result<(ExitStatus, Peak)> {
    let mut peak = Peak::default();
    loop {
        peak = peak.max(tree_memory(child.id()));
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok((status, peak));
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_resident_memory_and_a_tree_sums_at_least_it() {
        let own = rollup(std::process::id());
        assert!(own.rss > 0 && own.pss > 0, "{own:?}");
        let all = tree_memory(std::process::id());
        assert!(all.rss >= own.rss / 2, "{all:?} vs {own:?}");
        assert_eq!(own.max(Peak::default()), own);
        assert!(vm_rss(std::process::id()).is_some_and(|rss| rss > 0));
    }
}
