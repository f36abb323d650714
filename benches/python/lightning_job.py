"""The PyTorch side of kiln's end-to-end job benchmark (`cargo xtask bench --suite job`).

The whole default job as a PyTorch user runs it with PyTorch Lightning (`--trainer lightning`,
`Trainer.fit`), or as a plain PyTorch loop (`--trainer plain`, no Lightning: the same work, to
show what Lightning itself costs). Both do what `kiln train --data DIR` does:

- data: kiln's prepared shards (safetensors + kiln-dataset.json) read through a torch `Dataset`
  (memory-mapped once per worker, one sample per `__getitem__`, as `torch_loader.py` does),
  kiln's train/validation split (indices from --split), a `DataLoader` with --workers worker
  processes (persistent), shuffled, drop_last for training, in order for validation;
- model: the SignTransformer twin of kiln's transformer (train_step.py), built after
  `manual_seed(--seed)` so it starts from kiln's initial weights; attention as kiln computes it
  (--attention math: the explicit matmul-softmax kiln uses on the CPU under autocast; sdpa
  otherwise); nn.Dropout at --dropout;
- precision: --precision (Lightning's "bf16-mixed" is bf16 autocast, as kiln's bf16; "32-true"
  is fp32);
- optimizer: torch.optim.AdamW(fused=True), weight decay on matrices only, linear warmup then
  cosine to 0 per optimizer step, gradient clipping to a total norm of --clip (in Lightning's
  `configure_gradient_clipping` hook: its `gradient_clip_val` refuses fused optimizers);
- validation (loss and accuracy over the whole validation set) and a checkpoint (model,
  optimizer and schedule state) after every epoch.

Prints one JSON line on stdout: the final validation loss and accuracy, steps, samples and the
time inside `fit` (or the loop); human text (Lightning's progress bar) goes to stderr.
"""
import argparse
import json
import os
import sys
import time

# The siblings in this directory (the script's own, first on sys.path): what the scripts share
# (kiln's optimizer and schedule, the scores), the model twins, the shard reader.
from common import (add_scores, add_training_args, lightning_module, log, optimizer,
                    scores, train_step)
import torch  # noqa: E402
from torch.utils.data import DataLoader, Subset  # noqa: E402

from torch_loader import ShardDataset  # noqa: E402
from train_step import SignTransformer  # noqa: E402


class Shards(ShardDataset):
    """kiln's prepared dataset, one (float32 features, label) sample per `__getitem__`, not
    normalized."""

    def __init__(self, root):
        super().__init__(root, 0.0, 1.0)

    def __getitem__(self, i):
        x, y = self.sample(i)
        return x.to(torch.float32), y


def build_model(a, features, seq, classes):
    torch.manual_seed(a.seed)
    return SignTransformer(features, seq, a.d_model, a.heads, a.layers, a.ff, classes, a.dropout,
                           a.attention == "math")


def loaders(a):
    shards = Shards(a.data)
    with open(a.split) as f:
        split = json.load(f)
    common = dict(batch_size=a.batch, num_workers=a.workers, persistent_workers=a.workers > 0)
    train = DataLoader(Subset(shards, split["train"]), shuffle=True, drop_last=True,
                       generator=torch.Generator().manual_seed(a.seed), **common)
    val = DataLoader(Subset(shards, split["val"]), shuffle=False, **common)
    return train, val, int(split["classes"])


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="kiln's prepared dataset directory")
    p.add_argument("--split", required=True, help="split.json: train and val indices, classes")
    p.add_argument("--out", required=True, help="directory for checkpoints and logs")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trainer", choices=["lightning", "plain"], default="lightning")
    p.add_argument("--precision", choices=["32-true", "bf16-mixed", "16-mixed"],
                   default="bf16-mixed")
    p.add_argument("--attention", choices=["math", "sdpa"], default="math")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    add_training_args(p, epochs=3)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and a.trainer == "plain":
        raise SystemExit("error: --trainer plain runs on the CPU only")
    train, val, classes = loaders(a)
    x0, _ = train.dataset[0]
    model = build_model(a, x0.shape[-1], x0.shape[0], classes)
    fit = lightning_fit if a.trainer == "lightning" else plain_fit
    result = fit(a, model, train, val)
    print(json.dumps({
        "framework": a.trainer, "torch_version": torch.__version__,
        "threads": torch.get_num_threads(), "precision": a.precision,
        "attention": a.attention, "workers": a.workers, "batch": a.batch,
        "samples": result["steps"] * a.batch, **result,
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
