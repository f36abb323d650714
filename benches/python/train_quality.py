"""The PyTorch side of kiln's learning-quality benchmark (`cargo xtask bench quality`): the plain
loop a careful user writes for kiln's job (the transformer twin seeded as kiln's, same split and
settings), validated every epoch; prints one JSON line. --lr-find trains at Lightning's
`Tuner.lr_find` suggestion; --task regression trains the MLP twin with mean squared error.
"""
import json
import math
import os
import sys
import time

from common import (add_scores, add_training_args, adamw_groups, batches, emit, lightning_module,
                    optimizer, parser, read_npy, scores, set_threads, train_step)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import train_step as twins  # noqa: E402 - the twins of kiln's models, beside this script


def main():
    p = parser(__doc__, schedule=["cosine", "constant"], task=["classification", "regression"])
    p.add_argument("--data", required=True, help="directory with features.npy, labels.npy")
    p.add_argument("--split", required=True, help="split.json: train and val indices")
    p.add_argument("--hidden", default="256,256", help="the MLP's widths (regression)")
    p.add_argument("--lr-find", action="store_true",
                   help="train at Lightning's lr_find suggestion instead of --lr")
    add_training_args(p)
    a = p.parse_args()
    set_threads(a.threads)
    start = time.perf_counter()
    x = read_npy(os.path.join(a.data, "features.npy"))
    y = read_npy(os.path.join(a.data, "labels.npy"))
    with open(a.split) as f:
        split = json.load(f)
    train_idx, val_idx = torch.tensor(split["train"]), torch.tensor(split["val"])
    xt, yt, xv, yv = x[train_idx], y[train_idx], x[val_idx], y[val_idx]
    regression = a.task == "regression"
    loss_fn = mse if regression else F.cross_entropy

    def build():
        torch.manual_seed(a.seed)
        if regression:
            hidden = [int(w) for w in a.hidden.split(",")]
            return twins.MLP(x.shape[1], hidden, 1, a.dropout)
        return twins.SignTransformer(x.shape[2], x.shape[1], a.d_model, a.heads, a.layers, a.ff,
                                     int(split["classes"]), a.dropout)

    def train_loader():
        return torch.utils.data.DataLoader(
            torch.utils.data.TensorDataset(xt, yt), batch_size=a.batch, shuffle=True,
            drop_last=True, generator=torch.Generator().manual_seed(a.seed))

    found = {}
    if a.lr_find:
        began = time.perf_counter()
        a.lr = lightning_lr_find(a, build(), train_loader(), loss_fn)
        found = {"lr": a.lr, "lr_find_seconds": time.perf_counter() - began}
    model = build()
    loader = train_loader()
    total = len(loader) * a.epochs  # steps: every batch trains (drop_last)
    opt, sched = optimizer(model, a, total, constant=a.schedule == "constant")
    epochs = []
    model.train()
    for epoch in range(a.epochs):
        for xb, yb in loader:
            train_step(model, opt, xb, yb, a.clip, sched, loss_fn=loss_fn)
        add = add_squared_errors if regression else add_scores
        val_loss, val_acc = scores(model, batches(xv, yv, 256), add=add)
        second = {"val_rmse": math.sqrt(val_loss)} if regression else {"val_accuracy": val_acc}
        epochs.append({"epoch": epoch, "val_loss": val_loss, **second})
    emit({"framework": "pytorch", "torch_version": torch.__version__, "seed": a.seed,
          "steps": total, "threads": torch.get_num_threads(),
          **{f"final_{k}": v for k, v in epochs[-1].items() if k != "epoch"},
          "epochs": epochs, "seconds": time.perf_counter() - start, **found})


def mse(out, y):
    """Mean squared error of a one-output model's [B, 1] against targets [B], as kiln's mse."""
    return F.mse_loss(out.squeeze(1), y)


def add_squared_errors(sums, model, x, y):
    """Adds a batch's summed squared error and its count to `sums` (as `add_scores`)."""
    sums[0] += F.mse_loss(model(x).squeeze(1), y, reduction="sum").item()
    sums[2] += y.numel()


def lightning_lr_find(a, model, loader, loss_fn):
    """Lightning's `Tuner.lr_find` suggestion (its defaults, the run's AdamW groups, clipping)."""
    import lightning as L
    from lightning.pytorch.tuner import Tuner

    class Job(lightning_module(model, a.clip, loss_fn, log_loss=False)):
        def __init__(self):
            super().__init__()
            self.lr = a.lr

        def configure_optimizers(self):
            groups = adamw_groups(list(self.model.parameters()), a.weight_decay)
            return torch.optim.AdamW(groups, lr=self.lr, fused=True)

    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    found = Tuner(trainer).lr_find(Job(), train_dataloaders=loader)
    suggestion = found.suggestion() if found is not None else None
    if suggestion is None:
        raise SystemExit("Lightning's lr_find made no suggestion")
    return float(suggestion)


if __name__ == "__main__":
    sys.exit(main())
