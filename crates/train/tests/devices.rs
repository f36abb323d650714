//! One seed, one model on the CPU and on CUDA: kiln's own models draw their initial weights on
//! the CPU (as a PyTorch module built before `.to(device)` does), so the first steps agree.

mod common;

use kiln_config::load;
use kiln_device::Device;
use kiln_train::TrainError;
use kiln_train::record::{Observer, StepRecord};
use kiln_train::run::{RunControl, train};

#[derive(Default)]
struct Losses(Vec<f64>);

impl Observer for Losses {
    fn on_log(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        self.0.push(r.metrics.loss());
        Ok(())
    }
}

fn first_losses(device: Device) -> Vec<f64> {
    let out = tempfile::tempdir().unwrap();
    let base = [
        "model.name=mlp",
        "model.dropout=0",
        "data.synthetic_samples=712",
        "data.num_workers=1",
        "train.amp=none",
        "train.batch_size=64",
        "train.epochs=1",
        "train.log_interval=1",
        "checkpoint.enabled=false",
    ];
    let plan = load(&common::run_request(out.path(), &base, &[]))
        .unwrap()
        .plan;
    let mut losses = Losses::default();
    train(&plan, device, None, RunControl::default(), &mut losses).unwrap();
    losses.0
}

#[test]
#[ignore = "needs CUDA; `cargo xtask test --cuda` runs it"]
fn first_steps_on_cuda_match_the_cpu() {
    let gpus = kiln_torch_ext::cuda::device_count().unwrap_or(0);
    assert!(
        gpus > 0,
        "this test needs a CUDA device and this machine has none"
    );
    let cpu = first_losses(Device::Cpu);
    let cuda = first_losses(Device::Cuda(0));
    assert_eq!(cpu.len(), 10);
    assert_eq!(cuda.len(), 10);
    for (step, (c, g)) in cpu.iter().zip(&cuda).enumerate().take(3) {
        assert!(
            (c - g).abs() <= 1e-4 * c.abs(),
            "step {}: CPU {c} vs CUDA {g}",
            step + 1
        );
    }
}
