"""What the baselines' scripts share (each imports it from this directory, its own, so on
sys.path): torch imported without numpy's warning, logging to stderr, readers of kiln's .npy and
safetensors files that need no numpy, kiln's AdamW groups, warmup + cosine schedule and their
command-line options, the training step, held-out scores, a Lightning module with kiln's
clipping, a torch.export program's saving, and the JSON of a torch.compile run that could not run.
"""

import argparse
import contextlib
import json
import math
import mmap
import struct
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is not needed
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "F64": torch.float64, "U8": torch.uint8, "I8": torch.int8,
                      "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def read_npy(path, shape=None):
    """A little-endian .npy file (f4 or i8, C order) as a tensor; with `shape`, its first
    prod(shape) values in that shape (kiln's synthetic samples do not depend on the dataset's
    length, so a shorter run reads a prefix of a longer one's)."""
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
    tensor = torch.frombuffer(bytearray(data[start + header_len:]), dtype=dtype)
    if shape is None:
        return tensor.reshape(header["shape"])
    if tensor.numel() < math.prod(shape):
        raise SystemExit(f"error: {path} holds {tensor.numel()} values, fewer than {shape}")
    return tensor[:math.prod(shape)].view(*shape)


def open_safetensors(path):
    """Maps a safetensors file (8-byte little-endian header length, JSON header, data); returns
    {name: tensor view} without copying."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    (n,) = struct.unpack("<Q", mm[:8])
    out = {}
    for name, info in json.loads(mm[8:8 + n]).items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise SystemExit(f"error: {path}: tensor {name} has dtype {info['dtype']}, "
                             f"which this reader does not know")
        start, end = info["data_offsets"]
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        t = torch.frombuffer(mm, dtype=dtype, count=count, offset=8 + n + start)
        out[name] = t.view(info["shape"])
    return out


def adamw_groups(params, weight_decay=0.01):
    """AdamW's parameter groups as kiln makes them: weight decay on parameters with dim >= 2,
    none on the others."""
    groups = ({"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0})
    return [g for g in groups if g["params"]]


def lr_factor(step, warmup, total, constant=False):
    """kiln's schedule as a factor of the base lr: (s+1)/W while warming up, then cosine to 0 at
    `total` optimizer steps (or constant)."""
    if step < warmup:
        return (step + 1) / warmup
    if constant:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer(model, a, total_steps, constant=False):
    """Fused AdamW (kiln's groups, --lr, --weight-decay) and kiln's schedule over
    `total_steps` (or constant after the warmup)."""
    groups = adamw_groups(list(model.parameters()), a.weight_decay)
    opt = torch.optim.AdamW(groups, lr=a.lr, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_factor(s, a.warmup, total_steps, constant))
    return opt, sched


def at_least(least):
    """An argparse type: an integer no less than `least`."""
    def parse(text):
        value = int(text)
        if value < least:
            raise argparse.ArgumentTypeError(f"must be {'positive' if least else '>= 0'}, "
                                             f"got {value}")
        return value
    parse.__name__ = "int"  # what argparse names in its message for a non-integer
    return parse


def add_training_args(p, threads=None, **defaults):
    """The options of kiln's training the scripts share: the transformer's shape, the seed,
    kiln's optimizer, schedule and clipping, the epochs, batch size and dropout, and torch's
    threads (default `threads`; None: torch's choice). `defaults` replaces some of the
    defaults, by name; a default of None makes that option required."""
    options = {"d_model": 256, "heads": 8, "layers": 4, "ff": 1024, "seed": 0, "warmup": 50,
               "lr": 1e-3, "weight_decay": 0.01, "epochs": 2, "batch": 16, "dropout": 0.1,
               **defaults}
    for name, default in options.items():
        kind = int if default is None else type(default)
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                       required=default is None)
    p.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--threads", type=int, default=threads, help="torch's threads")


def train_step(model, opt, x, y, clip=0.0, sched=None, autocast=contextlib.nullcontext,
               loss_fn=F.cross_entropy):
    """One training step as kiln's trainer takes it: forward and `loss_fn` (mean; cross-entropy
    by default) under `autocast()`, zero_grad, backward, the global gradient norm clipped to
    `clip` (0: no clipping), the optimizer's step and the schedule's; returns the loss."""
    with autocast():
        loss = loss_fn(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    if sched is not None:
        sched.step()
    return loss


def add_scores(sums, model, x, y):
    """Adds a batch's summed loss, right answers and judged elements to `sums` (one per
    sample, or one per voxel of a class map)."""
    out = model(x).float()
    sums[0] += F.cross_entropy(out, y, reduction="sum").item()
    sums[1] += (out.argmax(1) == y).sum().item()
    sums[2] += y.numel()


def scores(model, batches, autocast=contextlib.nullcontext, add=add_scores):
    """Mean loss and accuracy over `batches` of (x, y), in eval mode, under `autocast()`, each
    batch's sums added by `add` (as `add_scores`)."""
    model.eval()
    sums = [0.0, 0, 0]
    with torch.no_grad(), autocast():
        for x, y in batches:
            add(sums, model, x, y)
    model.train()
    n = max(1, sums[2])
    return sums[0] / n, sums[1] / n


def batches(x, y, size):
    """(x, y) in consecutive batches of `size` rows."""
    return ((x[i:i + size], y[i:i + size]) for i in range(0, len(y), size))


def lightning_module(model, clip, loss_fn=F.cross_entropy, log_loss=True):
    """A LightningModule class training `model` with `loss_fn` (logged as "train_loss" with
    `log_loss`), the global gradient norm clipped to `clip` (0: no clipping)."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, _):
            x, y = batch
            loss = loss_fn(self.model(x), y)
            if log_loss:
                self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None,
                                        gradient_clip_algorithm=None):
            # Lightning refuses `gradient_clip_val` with a fused optimizer under its mixed
            # precision plugin (the fused step may unscale internally); with bf16 there is no
            # scaler, so clipping here, in the hook Lightning documents for custom clipping, is
            # exact.
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.parameters(), clip)

    return Module


def save_program(model, example, path):
    """`model` in train mode exported by torch.export with a dynamic batch dimension (as a user
    ships it; `example` a batch of two), saved at `path`."""
    shapes = ({0: torch.export.Dim("batch")},)
    torch.export.save(torch.export.export(model.train(), (example,), dynamic_shapes=shapes), path)


def not_run(error, **fields):
    """The JSON of a --compile run that could not compile here (`fields` say what it was), with
    the reason."""
    text = f"{type(error).__name__}: {error}".strip().splitlines()
    reason = text[0] if text else type(error).__name__
    if len(reason) > 300:
        reason = reason[:297] + "..."
    log(f"torch.compile did not run: {reason}")
    return {"framework": "pytorch-compile", "torch_version": torch.__version__, **fields,
            "not_run": f"torch.compile failed: {reason}"}
