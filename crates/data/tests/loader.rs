//! The loader's promises: every sample exactly once per epoch (shuffled or not, across ranks),
//! reproducible seeded orders, resume, the same batches whatever the worker count (changed
//! mid-epoch too), batches written into the memory the consumer provides, errors and panics
//! that name the sample, and bad settings refused.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use kiln_data::{
    BatchBuffers, DataError, Dataset, FeatureBuffer, InMemory, Loader, LoaderConfig, Position,
    Sampler, SamplerConfig, SyntheticClassification,
};

/// A dataset whose sample i is `[i, i + 0.5]` with label i, so batches show which samples they hold.
fn numbered(n: usize) -> Arc<InMemory> {
    let features = (0..n).flat_map(|i| [i as f32, i as f32 + 0.5]).collect();
    Arc::new(InMemory::new(features, (0..n as i64).collect(), vec![2]).unwrap())
}

fn config(batch_size: usize, num_workers: usize, shuffle: bool) -> LoaderConfig {
    LoaderConfig {
        batch_size,
        num_workers,
        prefetch_factor: 2,
        drop_last: false,
        sampler: SamplerConfig {
            shuffle,
            seed: 7,
            ..SamplerConfig::default()
        },
        inline_threads: 1,
        by_name: false,
    }
}

fn epoch_indices<D: Dataset>(loader: &mut Loader<D>, epoch: u64) -> Vec<usize> {
    loader
        .epoch(epoch)
        .flat_map(|b| b.unwrap().indices)
        .collect()
}

#[test]
fn every_sample_exactly_once_per_epoch_with_and_without_shuffle() {
    for shuffle in [false, true] {
        for workers in [0, 1, 3] {
            let mut loader = Loader::new(numbered(103), config(10, workers, shuffle)).unwrap();
            assert_eq!(loader.batches_per_epoch(), 11);
            for epoch in 0..2 {
                let seen = epoch_indices(&mut loader, epoch);
                assert_eq!(seen.len(), 103);
                assert_eq!(seen.iter().copied().collect::<BTreeSet<_>>().len(), 103);
            }
        }
    }
}

#[test]
fn batches_carry_the_right_contiguous_data() {
    let mut loader = Loader::new(numbered(20), config(8, 2, true)).unwrap();
    for batch in loader.epoch(0) {
        let batch = batch.unwrap();
        assert_eq!(batch.shape, vec![batch.indices.len(), 2]);
        assert_eq!(batch.features.len(), batch.indices.len() * 2);
        for (k, &i) in batch.indices.iter().enumerate() {
            assert_eq!(batch.targets.classes().unwrap()[k], i as i64);
            assert_eq!(
                &batch.features[2 * k..2 * k + 2],
                &[i as f32, i as f32 + 0.5]
            );
        }
    }
}

#[test]
fn shuffled_orders_are_reproducible_and_differ_by_epoch() {
    let mut a = Loader::new(numbered(50), config(5, 2, true)).unwrap();
    let mut b = Loader::new(numbered(50), config(5, 0, true)).unwrap();
    let a0 = epoch_indices(&mut a, 0);
    assert_eq!(
        a0,
        epoch_indices(&mut b, 0),
        "same seed, same order, any worker count"
    );
    assert_ne!(a0, (0..50).collect::<Vec<_>>(), "shuffled");
    assert_ne!(a0, epoch_indices(&mut a, 1), "each epoch has its own order");
    let mut other_seed = config(5, 2, true);
    other_seed.sampler.seed = 8;
    let mut c = Loader::new(numbered(50), other_seed).unwrap();
    assert_ne!(a0, epoch_indices(&mut c, 0));
}

#[test]
fn ranks_share_each_epoch_with_every_sample_exactly_once() {
    for world_size in [1, 2, 3, 4] {
        let mut all = vec![];
        for rank in 0..world_size {
            let sampler = Sampler::new(
                101,
                SamplerConfig {
                    shuffle: true,
                    seed: 3,
                    rank,
                    world_size,
                },
            )
            .unwrap();
            let mine = sampler.epoch_indices(5);
            assert!(mine.len().abs_diff(101 / world_size) <= 1);
            all.extend(mine);
        }
        all.sort_unstable();
        assert_eq!(all, (0..101).collect::<Vec<_>>(), "world_size {world_size}");
    }
}

#[test]
fn resuming_gives_the_remaining_sequence_of_an_uninterrupted_epoch() {
    let mut loader = Loader::new(numbered(64), config(6, 2, true)).unwrap();
    let full: Vec<Vec<usize>> = loader.epoch(3).map(|b| b.unwrap().indices).collect();
    // Stop after 4 batches (the iterator is dropped with batches still in flight)…
    let first: Vec<_> = loader.epoch(3).take(4).map(|b| b.unwrap().number).collect();
    assert_eq!(first, [0, 1, 2, 3]);
    // …then resume from that position, on a fresh loader as after a restart.
    let mut restarted = Loader::new(numbered(64), config(6, 3, true)).unwrap();
    let rest: Vec<Vec<usize>> = restarted
        .resume(Position { epoch: 3, batch: 4 })
        .map(|b| b.unwrap().indices)
        .collect();
    assert_eq!(rest, full[4..]);
    // The loader that was interrupted serves a whole next epoch correctly too.
    assert_eq!(epoch_indices(&mut loader, 4).len(), 64);
}

#[test]
fn changing_the_worker_count_mid_epoch_keeps_the_batches() {
    let mut reference = Loader::new(numbered(64), config(5, 2, true)).unwrap();
    let full: Vec<Vec<usize>> = reference.epoch(1).map(|b| b.unwrap().indices).collect();
    let mut loader = Loader::new(numbered(64), config(5, 0, true)).unwrap();
    let mut seen = vec![];
    // 0 workers, then 3, then 1, then 0 again: each change mid-epoch, batches still in flight.
    for (workers, from, to) in [(3, 3, 7), (1, 7, 8), (0, 8, full.len())] {
        if seen.is_empty() {
            seen.extend(loader.epoch(1).take(from).map(|b| b.unwrap().indices));
        }
        loader.set_workers(workers).unwrap();
        assert_eq!(loader.config().num_workers, workers);
        let position = Position {
            epoch: 1,
            batch: from,
        };
        seen.extend(
            loader
                .resume(position)
                .take(to - from)
                .map(|b| b.unwrap().indices),
        );
    }
    assert_eq!(seen, full);
    // The next epoch is whole and right with the last count.
    assert_eq!(
        epoch_indices(&mut loader, 2),
        epoch_indices(&mut reference, 2)
    );
    let mut cfg = config(5, 0, true);
    cfg.prefetch_factor = 0;
    let mut inline = Loader::new(numbered(8), cfg).unwrap();
    let err = inline.set_workers(2).unwrap_err().to_string();
    assert!(err.contains("prefetch_factor"), "{err}");
}

#[test]
fn inline_batches_read_in_parts_by_several_threads_are_the_same_batches() {
    let batches = |inline_threads| {
        let config = LoaderConfig {
            inline_threads,
            ..config(10, 0, true)
        };
        let mut loader = Loader::new(numbered(103), config).unwrap();
        (0..2)
            .flat_map(|epoch| loader.epoch(epoch).map(Result::unwrap).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let one = batches(1);
    assert_eq!(one.len(), 22);
    for threads in [2, 3, 16] {
        assert_eq!(batches(threads), one, "{threads} threads");
    }
}

/// Hands out memory of its own (a boxed slice of NaNs, not a `Vec`) and records the sizes asked.
#[derive(Default)]
struct Counting {
    asked: Mutex<Vec<usize>>,
}

impl BatchBuffers for Counting {
    fn features(&self, len: usize) -> FeatureBuffer {
        self.asked.lock().unwrap().push(len);
        let mut block = vec![f32::NAN; len].into_boxed_slice();
        let ptr = block.as_mut_ptr();
        // SAFETY: `ptr` points into `block`, which the buffer owns from here on.
        unsafe { FeatureBuffer::from_raw_parts(ptr, len, Box::new(block)) }
    }
}

#[test]
fn batches_are_written_into_the_memory_the_consumer_provides() {
    let batches = |workers, inline_threads, buffers: Option<Arc<Counting>>| {
        let config = LoaderConfig {
            inline_threads,
            ..config(10, workers, true)
        };
        let mut loader = match buffers {
            Some(b) => Loader::with_buffers(numbered(103), config, b).unwrap(),
            None => Loader::new(numbered(103), config).unwrap(),
        };
        loader.epoch(0).map(Result::unwrap).collect::<Vec<_>>()
    };
    let plain = batches(0, 1, None);
    for (workers, inline) in [(0, 1), (0, 3), (2, 1)] {
        let counting = Arc::new(Counting::default());
        let got = batches(workers, inline, Some(Arc::clone(&counting)));
        assert_eq!(got, plain, "{workers} workers, {inline} inline threads");
        let mut asked = counting.asked.lock().unwrap().clone();
        asked.sort_unstable();
        assert_eq!(
            asked,
            [[6].as_slice(), &[20; 10]].concat(),
            "one buffer per batch"
        );
        for batch in got {
            let owner = batch.features.into_owner();
            assert!(
                owner.downcast::<Box<[f32]>>().is_ok(),
                "the provider's own memory"
            );
        }
    }
}

#[test]
fn drop_last_drops_only_the_incomplete_batch() {
    let mut cfg = config(10, 2, false);
    cfg.drop_last = true;
    let mut loader = Loader::new(numbered(25), cfg).unwrap();
    assert_eq!(loader.batches_per_epoch(), 2);
    let sizes: Vec<_> = loader.epoch(0).map(|b| b.unwrap().indices.len()).collect();
    assert_eq!(sizes, [10, 10]);
}

/// Fails (or panics) on one sample.
struct Faulty {
    bad: usize,
    panic: bool,
}

impl Dataset for Faulty {
    fn len(&self) -> usize {
        100
    }
    fn sample_shape(&self) -> &[usize] {
        &[1]
    }
    fn read(&self, index: usize, out: &mut [f32]) -> Result<i64, DataError> {
        if index == self.bad {
            if self.panic {
                panic!("corrupt record");
            }
            return Err(DataError::Sample {
                index,
                message: "checksum mismatch".to_owned(),
            });
        }
        out[0] = index as f32;
        Ok(0)
    }
}

#[test]
fn a_failing_or_panicking_sample_ends_the_epoch_with_an_error_naming_it() {
    for panic in [false, true] {
        for (workers, inline_threads) in [(0, 1), (0, 3), (2, 1)] {
            let dataset = Arc::new(Faulty { bad: 57, panic });
            let config = LoaderConfig {
                inline_threads,
                ..config(8, workers, false)
            };
            let mut loader = Loader::new(dataset, config).unwrap();
            let results: Vec<_> = loader.epoch(0).collect();
            let err = results
                .iter()
                .find_map(|r| r.as_ref().err())
                .expect("the bad sample must surface");
            let text = err.to_string();
            assert!(text.contains("sample 57"), "{text}");
            if panic {
                assert!(matches!(err, DataError::WorkerPanic { .. }), "{text}");
                assert!(text.contains("corrupt record"), "{text}");
            }
            assert!(results.last().unwrap().is_err(), "nothing after the error");
            // The loader still works for the next epoch's good batches.
            let ok = loader.epoch(1).take(3).all(|b| b.is_ok());
            assert!(ok);
        }
    }
}

#[test]
fn bad_settings_and_data_are_refused_with_the_key() {
    let err = Loader::new(numbered(4), config(0, 1, false)).unwrap_err();
    assert_eq!(err.to_string(), "`batch_size` = 0 is invalid: at least 1");
    let mut cfg = config(2, 2, false);
    cfg.prefetch_factor = 0;
    assert!(
        Loader::new(numbered(4), cfg)
            .unwrap_err()
            .to_string()
            .contains("`prefetch_factor`")
    );
    let mut cfg = config(2, 0, false);
    cfg.sampler.world_size = 2;
    cfg.sampler.rank = 2;
    assert_eq!(
        Loader::new(numbered(4), cfg).unwrap_err().to_string(),
        "`rank` = 2 is invalid: below world_size (2)"
    );
    let err = InMemory::new(vec![0.0; 5], vec![0, 1], vec![2])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected 2 labels × 2 values = 4, got 5 values"),
        "{err}"
    );
    assert!(SyntheticClassification::new(10, vec![4], 1, 0, 0.1).is_err());
}

#[test]
fn synthetic_data_is_deterministic_and_learnable() {
    let d = SyntheticClassification::new(200, vec![16], 4, 11, 0.3).unwrap();
    let mut a = vec![0.0; 16];
    let mut b = vec![0.0; 16];
    assert_eq!(d.read(5, &mut a).unwrap(), d.read(5, &mut b).unwrap());
    assert_eq!(a, b, "same seed and index, same sample");
    // Learnable: nearest class mean (estimated from the first half) classifies the second half
    // far above chance (25%).
    let mut means = vec![vec![0.0f32; 16]; 4];
    let mut counts = [0f32; 4];
    for i in 0..100 {
        let y = d.read(i, &mut a).unwrap() as usize;
        counts[y] += 1.0;
        means[y].iter_mut().zip(&a).for_each(|(m, x)| *m += x);
    }
    for (m, c) in means.iter_mut().zip(counts) {
        m.iter_mut().for_each(|v| *v /= c);
    }
    let correct = (100..200)
        .filter(|&i| {
            let y = d.read(i, &mut a).unwrap() as usize;
            let dist = |m: &Vec<f32>| m.iter().zip(&a).map(|(p, q)| (p - q).powi(2)).sum::<f32>();
            (0..4).min_by(|&p, &q| dist(&means[p]).total_cmp(&dist(&means[q]))) == Some(y)
        })
        .count();
    assert!(correct > 90, "nearest-mean accuracy {correct}/100");
}
