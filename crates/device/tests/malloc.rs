//! glibc's thresholds as a run sets them (`performance.malloc_tuning`): a large buffer freed
//! and allocated again is reused, not mapped afresh and faulted in page by page. One test: the
//! thresholds are process-wide.

/// This process's minor page faults so far (`/proc/self/stat`, field 10).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    after_name.split(' ').nth(7).unwrap().parse().unwrap()
}

/// The faults of a third cycle of allocating, filling and freeing `bytes`.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn faults_of_a_warm_cycle(bytes: usize) -> u64 {
    let cycle = || drop(std::hint::black_box(vec![1u8; bytes]));
    cycle();
    cycle();
    let before = minor_faults();
    cycle();
    minor_faults() - before
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_freed_large_buffer_is_reused_once_the_thresholds_are_set() {
    // Above glibc's largest moving mmap threshold (32 MiB), below a thread's heap (64 MiB).
    let bytes = 48 << 20;
    let pages = (bytes / 4096) as u64;
    let untuned = faults_of_a_warm_cycle(bytes);
    assert!(
        untuned > pages / 2,
        "glibc's defaults: {untuned} faults for {pages} pages"
    );
    kiln_device::malloc::keep_freed_memory().unwrap();
    let tuned = faults_of_a_warm_cycle(bytes);
    assert!(
        tuned * 20 < untuned,
        "tuned: {tuned} faults, against {untuned} with glibc's defaults"
    );
}
