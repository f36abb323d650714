//! A `Learner` built with `join_launched_ranks` joins the ranks its launcher's variables
//! describe (here a world of one, set in this test binary's own environment, which no other
//! test shares) and trains in that group; without them it trains alone.

use kiln_train::prelude::*;

fn dataset() -> InMemory {
    let xs: Vec<f32> = (0..512)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let ys: Vec<f32> = xs.chunks(2).map(|p| p[0] - 0.5 * p[1]).collect();
    InMemory::with_targets(
        xs,
        vec![2],
        TargetSpec::Values { shape: vec![] },
        Targets::Values(ys),
    )
    .unwrap()
}

fn network(vs: &nn::VarStore, _input: &InputSpec) -> Result<Box<dyn Model>, TrainError> {
    let net = nn::seq().add(nn::linear(vs.root() / "fc", 2, 1, Default::default()));
    Ok(Box::new(TchModule(net)))
}

#[test]
fn a_learner_joins_the_launched_ranks_and_trains_in_their_group() {
    let tmp = tempfile::tempdir().unwrap();
    let build = || {
        Learner::builder()
            .set("train.epochs", 2)
            .set("train.batch_size", 32)
            .set("train.amp", "fp32")
            .output_dir(tmp.path())
            .join_launched_ranks(true)
            .build()
            .unwrap()
    };
    assert_eq!(build().rank(), (0, 1), "no launcher: alone");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // SAFETY: this test binary holds this one test, so no other thread reads the environment.
    unsafe {
        std::env::set_var("RANK", "0");
        std::env::set_var("WORLD_SIZE", "1");
        std::env::set_var("MASTER_ADDR", "127.0.0.1");
        std::env::set_var("MASTER_PORT", port.to_string());
    }
    let learner = build();
    assert_eq!(learner.rank(), (0, 1));
    let outcome = learner.fit("linear", network, dataset()).unwrap();
    assert!(outcome.summary.steps > 0);
    assert!(outcome.run_dir.join("metrics.jsonl").is_file());
}
