//! The fuzzing engine: a run is the same sequence of inputs for the same seed, outcomes that
//! differ only in what varies between inputs share a signature, and the corpus keeps an input
//! for each new one.

use kiln_fuzz::mutate::Mutator;
use kiln_fuzz::runner::{Corpus, signature};
use kiln_fuzz::{Grammar, Outcomes, Rng};

/// The first `n` inputs of a corpus of `seeds` mutated with generator seed `seed`.
fn sequence(seed: u64, seeds: &[&[u8]], n: u64) -> Vec<Vec<u8>> {
    let corpus = Corpus::new(seeds.iter().map(|s| s.to_vec()).collect());
    let mut m = Mutator::new(Rng::new(seed), Grammar::Json, &[b"\"shape\""], 4096);
    (0..n).map(|i| corpus.next(i, &mut m)).collect()
}

#[test]
fn the_same_seed_gives_the_same_inputs_and_another_seed_others() {
    let seeds: [&[u8]; 2] = [
        br#"{"shape": [2, 3], "dtype": "f32"}"#,
        b"\x93NUMPY\x01\x00",
    ];
    let a = sequence(7, &seeds, 500);
    assert_eq!(a, sequence(7, &seeds, 500));
    assert_ne!(a, sequence(8, &seeds, 500));
    // The seeds come first, as they are; then mutations, nearly all new.
    assert_eq!(a[0], seeds[0]);
    assert_eq!(a[1], seeds[1]);
    let distinct: std::collections::HashSet<&Vec<u8>> = a[2..].iter().collect();
    assert!(distinct.len() > 400, "{} distinct", distinct.len());
}

#[test]
fn mutations_of_json_reach_huge_numbers_and_stay_json_often() {
    let seeds: [&[u8]; 1] = [br#"{"shape": [2, 3], "samples": 6}"#];
    let inputs = sequence(1, &seeds, 3000);
    let json = inputs
        .iter()
        .filter(|i| serde_json::from_slice::<serde_json::Value>(i).is_ok())
        .count();
    assert!(json > 600, "{json} of 3000 are JSON");
    let huge = inputs.iter().any(|i| {
        let text = String::from_utf8_lossy(i);
        text.contains("1000000000000") || text.contains("18446744073709551615")
    });
    assert!(huge);
}

#[test]
fn outcomes_differing_in_numbers_and_quoted_values_share_a_signature() {
    let err = |m: &str| Err(m.to_owned());
    let a = signature(
        &err("/tmp/x/a.npy: shape entry `abc` is not a number at 12"),
        "/tmp/x",
    );
    let b = signature(
        &err("/tmp/y/a.npy: shape entry `zz` is not a number at 7"),
        "/tmp/y",
    );
    assert_eq!(a, b);
    let c = signature(&err("/tmp/x/a.npy: the header is cut off"), "/tmp/x");
    assert_ne!(a, c);
    assert_ne!(signature(&Ok(()), ""), c);
}

#[test]
fn the_corpus_keeps_one_input_per_new_signature() {
    let mut corpus = Corpus::new(vec![b"seed".to_vec()]);
    let mut rng = Rng::new(0);
    corpus.observe(b"a", 1, &mut rng);
    corpus.observe(b"b", 1, &mut rng);
    corpus.observe(b"c", 2, &mut rng);
    assert_eq!(corpus.len(), 3);
}

#[test]
fn several_answers_make_one_outcome_naming_each() {
    let mut o = Outcomes::default();
    o.add(Ok::<(), String>(())).add(Err::<(), _>("bad header"));
    assert_eq!(o.finish(), Err("ok | bad header".to_owned()));
    let mut all_ok = Outcomes::default();
    all_ok.add(Ok::<u8, String>(1));
    assert_eq!(all_ok.finish(), Ok(()));
}
