//! Memory of a process tree on Linux: PSS and RSS summed over a process and all its
//! descendants, read from `/proc/<pid>/smaps_rollup` (zero where unreadable, e.g. not Linux).

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

/// `pid` and its descendants (through every thread's `children`), depth first.
fn tree(pid: u32, out: &mut Vec<u32>) {
    out.push(pid);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            tree(child, out);
        }
    }
}

/// PSS and RSS of one process.
fn rollup(pid: u32) -> Peak {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    Peak {
        pss: field("Pss:"),
        rss: field("Rss:"),
    }
}

/// Current PSS and RSS of process `pid` and all its descendants, summed.
pub fn tree_memory(pid: u32) -> Peak {
    let mut pids = Vec::new();
    tree(pid, &mut pids);
    pids.iter()
        .map(|&p| rollup(p))
        .fold(Peak::default(), |a, b| Peak {
            pss: a.pss + b.pss,
            rss: a.rss + b.rss,
        })
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
    }
}
