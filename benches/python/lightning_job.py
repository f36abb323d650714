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
import importlib.util
import json
import math
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.data import DataLoader, Dataset, Subset  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def sibling(name):
    """Imports benches/python/<name>.py (the model twins, the shard reader)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Shards(Dataset):
    """kiln's prepared dataset, one (float32 features, label) sample per `__getitem__`."""

    def __init__(self, root, open_safetensors):
        with open(os.path.join(root, "kiln-dataset.json")) as f:
            self.manifest = json.load(f)
        self.root, self.open_safetensors = root, open_safetensors
        self.starts, total = [], 0
        for shard in self.manifest["shards"]:
            self.starts.append(total)
            total += shard["samples"]
        self.len = total
        self.shards = None  # mapped lazily, once per worker process

    def __len__(self):
        return self.len

    def __getitem__(self, i):
        if self.shards is None:
            self.shards = []
            for shard in self.manifest["shards"]:
                t = self.open_safetensors(os.path.join(self.root, shard["features"]))
                self.shards.append((t["features"], t["targets"] if "targets" in t else t["labels"]))
        s = next(k for k in range(len(self.starts) - 1, -1, -1) if self.starts[k] <= i)
        feats, labels = self.shards[s]
        j = i - self.starts[s]
        return feats[j].to(torch.float32), int(labels[j])


def lr_factor(step, warmup, total):
    """kiln's schedule as a factor of the base lr: (s+1)/W while warming up, then cosine to 0 at
    `total` optimizer steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def build_model(a, features, seq, classes):
    torch.manual_seed(a.seed)
    twins = sibling("train_step")
    model = twins.SignTransformer(features, seq, a.d_model, a.heads, a.layers, a.ff, classes,
                                  a.dropout)
    for m in model.modules():
        if isinstance(m, twins.SelfAttention):
            m.math = a.attention == "math"
    return model


def optimizer_and_schedule(model, a, total_steps):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        plain = param.dim() >= 2 and not name.endswith("bias") and "ln" not in name
        (decay if plain else no_decay).append(param)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, a.warmup, total_steps))
    return opt, sched


def loaders(a):
    shards = Shards(a.data, sibling("torch_loader").open_safetensors)
    with open(a.split) as f:
        split = json.load(f)
    common = {"batch_size": a.batch, "num_workers": a.workers,
              "persistent_workers": a.workers > 0}
    train = DataLoader(Subset(shards, split["train"]), shuffle=True, drop_last=True,
                       generator=torch.Generator().manual_seed(a.seed), **common)
    val = DataLoader(Subset(shards, split["val"]), shuffle=False, **common)
    features_shape = shards.manifest.get("sample_shape") or shards.manifest.get("shape")
    return train, val, int(split["classes"]), features_shape


def autocast(a):
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(a.precision)
    return torch.autocast(a.device, dtype=dtype, enabled=dtype is not None)


def lightning_fit(a, model, train, val):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    total = len(train) * a.epochs

    class Job(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model
            self.sums = [0.0, 0, 0]

        def training_step(self, batch, _):
            x, y = batch
            loss = F.cross_entropy(self.model(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def on_validation_epoch_start(self):
            self.sums = [0.0, 0, 0]

        def validation_step(self, batch, _):
            x, y = batch
            out = self.model(x).float()
            self.sums[0] += F.cross_entropy(out, y, reduction="sum").item()
            self.sums[1] += (out.argmax(-1) == y).sum().item()
            self.sums[2] += len(y)

        def on_validation_epoch_end(self):
            n = max(1, self.sums[2])
            self.log("val_loss", self.sums[0] / n, prog_bar=True)
            self.log("val_acc", self.sums[1] / n, prog_bar=True)

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                        gradient_clip_algorithm=None):
            # Lightning refuses `gradient_clip_val` with a fused optimizer under its mixed
            # precision plugin (the fused step may unscale internally); with bf16 there is no
            # scaler, so clipping here, in the hook Lightning documents for custom clipping, is
            # exact.
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(self.parameters(), a.clip)

        def configure_optimizers(self):
            opt, sched = optimizer_and_schedule(self.model, a, total)
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


def evaluate(model, val, a):
    model.eval()
    loss, right, n = 0.0, 0, 0
    with torch.no_grad(), autocast(a):
        for x, y in val:
            out = model(x).float()
            loss += F.cross_entropy(out, y, reduction="sum").item()
            right += (out.argmax(-1) == y).sum().item()
            n += len(y)
    model.train()
    return loss / max(1, n), right / max(1, n)


def plain_fit(a, model, train, val):
    total = len(train) * a.epochs
    opt, sched = optimizer_and_schedule(model, a, total)
    os.makedirs(os.path.join(a.out, "checkpoints"), exist_ok=True)
    start, step = time.perf_counter(), 0
    model.train()
    for epoch in range(a.epochs):
        for x, y in train:
            with autocast(a):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            sched.step()
            step += 1
            if step % 50 == 0:
                print(f"step {step}/{total} loss {loss.item():.4f}", file=sys.stderr, flush=True)
        val_loss, val_acc = evaluate(model, val, a)
        print(f"epoch {epoch}: val loss {val_loss:.4f} accuracy {val_acc:.4f}", file=sys.stderr)
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                    "schedule": sched.state_dict(), "epoch": epoch, "step": step},
                   os.path.join(a.out, "checkpoints", f"epoch-{epoch}.pt"))
    return {"steps": step, "final_val_loss": val_loss, "final_val_accuracy": val_acc,
            "fit_seconds": time.perf_counter() - start}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trainer", choices=["lightning", "plain"], default="lightning")
    p.add_argument("--data", required=True, help="kiln's prepared dataset directory")
    p.add_argument("--split", required=True, help="split.json: train and val indices, classes")
    p.add_argument("--out", required=True, help="directory for checkpoints and logs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--precision", choices=["32-true", "bf16-mixed", "16-mixed"],
                   default="bf16-mixed")
    p.add_argument("--attention", choices=["math", "sdpa"], default="math")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ff", type=int, default=1024)
    p.add_argument("--threads", type=int)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.device == "cuda" and a.trainer == "plain":
        raise SystemExit("error: --trainer plain runs on the CPU only")
    train, val, classes, _ = loaders(a)
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
