//! Dropping a loader mid-epoch stops and joins its workers: no thread outlives it. Alone in its
//! binary, because it counts the process's threads.

use std::sync::Arc;

use kiln_data::{Loader, LoaderConfig, SyntheticClassification};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

#[test]
fn dropping_a_loader_mid_epoch_joins_every_worker() {
    if !std::path::Path::new("/proc/self/task").exists() {
        eprintln!("no /proc/self/task on this OS: thread count not checked");
        return;
    }
    let before = threads();
    let dataset = Arc::new(SyntheticClassification::new(10_000, vec![64, 32], 10, 1, 0.5).unwrap());
    let config = LoaderConfig {
        batch_size: 64,
        num_workers: 4,
        prefetch_factor: 4,
        ..LoaderConfig::default()
    };
    let mut loader = Loader::new(dataset, config).unwrap();
    assert_eq!(threads(), before + 4);
    let taken = loader.epoch(0).take(3).filter(|b| b.is_ok()).count();
    assert_eq!(taken, 3);
    let stats = loader.stats();
    assert_eq!((stats.batches, stats.samples), (3, 192));
    drop(loader); // 16 batches were in flight
    // Joined threads leave /proc/self/task a moment after `join` returns (the kernel reaps them
    // asynchronously): give it up to two seconds, yielding, before calling them leaked.
    let joined = std::time::Instant::now();
    while threads() != before && joined.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::yield_now();
    }
    assert_eq!(threads(), before, "worker threads leaked");
}
