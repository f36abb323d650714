//! A PyTorch model trained from Rust: a program saved with `torch.export.save(
//! torch.export.export(model.train(), (batch,), dynamic_shapes=…), "model.pt2")` (or a
//! TorchScript module, the older format) trained on a dataset made by `kiln data prepare`,
//! through the library (what `kiln train --model model.pt2 --data DIR` does: the program's
//! train step compiled for this machine), with its progress printed as it goes. Each checkpoint
//! holds the weights under the program's names and the program itself (`model.pt2`).
//!
//!     cargo run -p kiln-examples --example own_model -- model.pt2 DATA_DIR [key=value …]

use kiln_train::prelude::*;
use kiln_train::record::Progress;

/// Prints one line per logged interval and per epoch.
struct Printer;

impl Observer for Printer {
    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        println!("step {} · loss {:.4}", r.step, r.metrics.loss());
        Ok(())
    }

    fn on_epoch(&mut self, e: &EpochRecord) -> Result<(), TrainError> {
        println!(
            "epoch {} · train loss {:.4} · val loss {}",
            e.epoch + 1,
            e.train.loss(),
            e.val
                .get("loss")
                .map_or("-".to_owned(), |l| format!("{l:.4}"))
        );
        Ok(())
    }

    fn on_step(&mut self, _: &Progress) -> Result<(), TrainError> {
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, data, sets @ ..] = args.as_slice() else {
        return Err("usage: own_model MODEL.pt2 DATA_DIR [key=value …]".into());
    };
    let sets: Vec<(&str, &str)> = sets
        .iter()
        .map(|set| {
            set.split_once('=')
                .ok_or_else(|| format!("`{set}`: expected key=value"))
        })
        .collect::<Result<_, _>>()?;
    let dataset = kiln_train::prelude::ShardedDataset::open(data)?;
    let outcome = train(model.as_ref(), dataset, &sets)?;
    println!(
        "done: {} ({}, loss {}) · final val loss {:?} · run directory {}",
        outcome.summary.model,
        outcome.summary.task,
        outcome.summary.loss,
        outcome.summary.final_val.get("loss"),
        outcome.run_dir.display()
    );
    Ok(())
}

/// Trains the model file `model` on `data` with the settings `sets` (`("train.epochs", "5")`,
/// …), printing its progress. (`tests/examples.rs` runs it on a program PyTorch exported.)
pub fn train<D: Dataset>(
    model: &std::path::Path,
    data: D,
    sets: &[(&str, &str)],
) -> Result<RunOutcome, Box<dyn std::error::Error>> {
    let mut builder = Learner::builder();
    for (key, value) in sets {
        builder = builder.set(key, value);
    }
    let learner = builder.build()?;
    Ok(learner.fit_file(model, data, &mut Printer)?)
}
