"""The PyTorch side of kiln's learning-quality benchmark (`cargo xtask bench quality`).

A plain PyTorch training loop, written as a careful user would, for the same job kiln runs:
the SignTransformer twin of kiln's transformer (train_step.py), on the same samples (read from
the .npy files kiln prepared its dataset from), with the same train/validation split (indices
from split.json), the same settings: AdamW (lr, weight decay 0.01 on matrices only, betas
(0.9, 0.999), eps 1e-8, fused), linear warmup then cosine to 0 per optimizer step, gradient
clipping to a total norm, dropout, batch size, drop_last, fp32, seeded with --seed before the
model is built (so it starts from the very weights kiln's model does). Validation after every
epoch. Prints one JSON line: the final validation loss and accuracy, each epoch's, and the
wall time.
"""
import argparse
import json
import math
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

# The twins of kiln's models and their held-out evaluation, beside this script (so on sys.path).
import train_step as twins  # noqa: E402
from same_learning import held_out  # noqa: E402


def read_npy(path):
    """A little-endian .npy file (f4 or i8, C order) as a tensor, without numpy."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:6] != b"\x93NUMPY":
        raise SystemExit(f"error: {path} is not a .npy file")
    start = 10 if data[6] == 1 else 12  # the header's length takes 2 bytes in version 1, else 4
    header_len = int.from_bytes(data[8:start], "little")
    header = eval(data[start:start + header_len].decode("latin1"))  # a Python dict literal
    if header["fortran_order"]:
        raise SystemExit(f"error: {path} is in Fortran order")
    dtype = {"<f4": torch.float32, "<i8": torch.int64}[header["descr"]]
    body = bytearray(data[start + header_len:])
    return torch.frombuffer(body, dtype=dtype).reshape(header["shape"])


def lr_at(step, base, warmup, total, schedule):
    """kiln's schedule: (s+1)/W·lr while warming up, then cosine from lr to 0 at `total` (or
    constant)."""
    if step < warmup:
        return base * (step + 1) / warmup
    if schedule == "constant":
        return base
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base * 0.5 * (1.0 + math.cos(math.pi * progress))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="directory with features.npy, labels.npy")
    p.add_argument("--split", required=True, help="split.json: train and val indices")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    p.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    for name, kind, default in (("--epochs", int, 2), ("--batch", int, 16), ("--lr", float, 1e-3),
                                ("--warmup", int, 50), ("--dropout", float, 0.1),
                                ("--d-model", int, 256), ("--heads", int, 8), ("--layers", int, 4),
                                ("--ff", int, 1024), ("--threads", int, None)):
        p.add_argument(name, type=kind, default=default)
    a = p.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    start = time.perf_counter()
    x = read_npy(os.path.join(a.data, "features.npy"))
    y = read_npy(os.path.join(a.data, "labels.npy"))
    with open(a.split) as f:
        split = json.load(f)
    train_idx, val_idx = torch.tensor(split["train"]), torch.tensor(split["val"])
    xt, yt, xv, yv = x[train_idx], y[train_idx], x[val_idx], y[val_idx]
    classes = int(split["classes"])

    torch.manual_seed(a.seed)
    model = twins.SignTransformer(x.shape[2], x.shape[1], a.d_model, a.heads, a.layers, a.ff,
                                  classes, a.dropout)
    opt = torch.optim.AdamW(twins.adamw_groups(list(model.parameters())), lr=a.lr, fused=True)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(xt, yt), batch_size=a.batch, shuffle=True,
        drop_last=True, generator=torch.Generator().manual_seed(a.seed))
    total = len(loader) * a.epochs
    step, epochs = 0, []
    model.train()
    for epoch in range(a.epochs):
        for xb, yb in loader:
            for group in opt.param_groups:
                group["lr"] = lr_at(step, a.lr, a.warmup, total, a.schedule)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if a.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
            opt.step()
            step += 1
        val_loss, val_acc = held_out(model, xv, yv, 256)
        epochs.append({"epoch": epoch, "val_loss": val_loss, "val_accuracy": val_acc})
    print(json.dumps({
        "framework": "pytorch", "torch_version": torch.__version__, "seed": a.seed,
        "steps": step, "threads": torch.get_num_threads(),
        "final_val_loss": epochs[-1]["val_loss"],
        "final_val_accuracy": epochs[-1]["val_accuracy"],
        "epochs": epochs, "seconds": time.perf_counter() - start,
    }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
