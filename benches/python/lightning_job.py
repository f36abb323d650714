"""The PyTorch side of kiln's end-to-end job benchmark (`cargo xtask bench --suite job`): the job
`kiln train --data DIR` runs, with PyTorch Lightning or a plain loop (--trainer), on kiln's shards
and split, kiln's model, optimizer, schedule and clipping, validating and checkpointing every epoch;
prints one JSON line on stdout (final validation scores, steps, the time inside fit).
"""
import json
import os
import sys
import time

# The siblings in this directory (first on sys.path): the shared parts, twins and shard reader.
from common import (add_scores, add_training_args, emit, lightning_module, log, optimizer,
                    parser, scores, set_threads, train_step)
import torch  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402

from torch_loader import ShardDataset  # noqa: E402
from train_step import SignTransformer  # noqa: E402


class Shards(ShardDataset):
    """kiln's prepared dataset, one (float32 features, label) sample per `__getitem__`."""

    def __init__(self, root):
        super().__init__(root, 0.0, 1.0)

    def __getitem__(self, i):
        x, y = self.sample(i)
        return x.to(torch.float32), y


def autocast(a):
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(a.precision)
    return torch.autocast(a.device, dtype=dtype, enabled=dtype is not None)


def lightning_fit(a, model, train, val):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    total = len(train) * a.epochs

    class Job(lightning_module(model, a.clip)):
        def on_validation_epoch_start(self):
            self.sums = [0.0, 0, 0]

        def validation_step(self, batch, _):
            add_scores(self.sums, self.model, *batch)

        def on_validation_epoch_end(self):
            n = max(1, self.sums[2])
            self.log("val_loss", self.sums[0] / n, prog_bar=True)
            self.log("val_acc", self.sums[1] / n, prog_bar=True)

        def configure_optimizers(self):
            opt, sched = optimizer(self.model, a, total)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    job = Job()
    trainer = L.Trainer(
        accelerator="gpu" if a.device == "cuda" else "cpu", devices=1, max_epochs=a.epochs,
        precision=a.precision, num_sanity_val_steps=0, default_root_dir=a.out,
        callbacks=[ModelCheckpoint(dirpath=os.path.join(a.out, "checkpoints"),
                                   every_n_epochs=1, save_top_k=-1)])
    start = time.perf_counter()
    trainer.fit(job, train, val)
    seconds = time.perf_counter() - start
    metrics = trainer.callback_metrics
    return {"lightning_version": L.__version__, "steps": trainer.global_step,
            "final_val_loss": float(metrics["val_loss"]),
            "final_val_accuracy": float(metrics["val_acc"]), "fit_seconds": seconds}


def plain_fit(a, model, train, val):
    total = len(train) * a.epochs
    opt, sched = optimizer(model, a, total)
    os.makedirs(os.path.join(a.out, "checkpoints"), exist_ok=True)
    start, step = time.perf_counter(), 0
    model.train()
    for epoch in range(a.epochs):
        for x, y in train:
            loss = train_step(model, opt, x, y, a.clip, sched, lambda: autocast(a))
            step += 1
            if step % 50 == 0:
                log(f"step {step}/{total} loss {loss.item():.4f}")
        val_loss, val_acc = scores(model, val, lambda: autocast(a))
        log(f"epoch {epoch}: val loss {val_loss:.4f} accuracy {val_acc:.4f}")
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "schedule": sched.state_dict(), "epoch": epoch, "step": step},
                   os.path.join(a.out, "checkpoints", f"epoch-{epoch}.pt"))
    return {"steps": step, "final_val_loss": val_loss, "final_val_accuracy": val_acc,
            "fit_seconds": time.perf_counter() - start}


def main():
    p = parser(__doc__, workers=2, trainer=["lightning", "plain"], attention=["math", "sdpa"],
               precision=["bf16-mixed", "32-true", "16-mixed"], device=["cpu", "cuda"])
    p.add_argument("--data", required=True, help="kiln's prepared dataset directory")
    p.add_argument("--split", required=True, help="split.json: train and val indices, classes")
    p.add_argument("--out", required=True, help="directory for checkpoints and logs")
    add_training_args(p, epochs=3)
    a = p.parse_args()
    set_threads(a.threads)
    if a.device == "cuda" and a.trainer == "plain":
        raise SystemExit("error: --trainer plain runs on the CPU only")
    shards = Shards(a.data)
    with open(a.split) as f:
        split = json.load(f)
    common = dict(batch_size=a.batch, num_workers=a.workers, persistent_workers=a.workers > 0)
    train = DataLoader(Subset(shards, split["train"]), shuffle=True, drop_last=True,
                       generator=torch.Generator().manual_seed(a.seed), **common)
    val = DataLoader(Subset(shards, split["val"]), shuffle=False, **common)
    x0, _ = train.dataset[0]
    torch.manual_seed(a.seed)  # kiln's initial weights
    model = SignTransformer(x0.shape[-1], x0.shape[0], a.d_model, a.heads, a.layers, a.ff,
                            int(split["classes"]), a.dropout, a.attention == "math")
    fit = lightning_fit if a.trainer == "lightning" else plain_fit
    result = fit(a, model, train, val)
    emit({"framework": a.trainer, "torch_version": torch.__version__,
          "threads": torch.get_num_threads(), "precision": a.precision, "attention": a.attention,
          "workers": a.workers, "batch": a.batch, "samples": result["steps"] * a.batch, **result})


if __name__ == "__main__":
    sys.exit(main())
