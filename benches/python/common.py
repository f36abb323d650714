"""What the baselines' scripts share (imported from this directory, on sys.path): argparse, .npy and
safetensors readers, kiln's optimizer, schedule and step, scores, Lightning, export, timing.
"""

import argparse
import contextlib
import json
import math
import mmap
import os
import resource
import struct
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is not needed
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SAFETENSORS_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "F64": torch.float64, "U8": torch.uint8, "I8": torch.int8,
                      "I16": torch.int16, "I32": torch.int32, "I64": torch.int64}


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def emit(result):
    """Prints the script's one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def set_threads(threads):
    """torch's intra-op threads, if given (None or 0: torch's choice)."""
    if threads:
        torch.set_num_threads(threads)


def read_npy(path, shape=None):
    """A little-endian C-order .npy file (f4 or i8) as a tensor, or its first prod(shape) values."""
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
    """{name: tensor view} of a memory-mapped safetensors file, nothing copied."""
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
    """AdamW's groups as kiln makes them: weight decay on parameters with dim >= 2 only."""
    groups = ({"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0})
    return [g for g in groups if g["params"]]


def lr_factor(step, warmup, total, constant=False):
    """kiln's schedule, a factor of the lr: (s+1)/W, then cosine to 0 at `total` (or constant)."""
    if step < warmup:
        return (step + 1) / warmup
    if constant:
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer(model, a, total_steps, constant=False):
    """Fused AdamW (kiln's groups, --lr, --weight-decay) and kiln's schedule over `total_steps`."""
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


def add_options(p, **options):
    """Adds a --NAME option per keyword: a default, a type (required), (type, default) or a list
    of choices, the first the default."""
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, list):
            p.add_argument(flag, choices=value, default=value[0])
        elif isinstance(value, type):
            p.add_argument(flag, type=value, required=True)
        else:
            kind, default = value if isinstance(value, tuple) else (type(value), value)
            p.add_argument(flag, type=kind, default=default)


def parser(doc, **options):
    """An ArgumentParser described by `doc`'s first paragraph, with `options` (see add_options)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_options(p, **options)
    return p


def add_training_args(p, threads=None, **defaults):
    """The training options the scripts share; `defaults` replaces some (see add_options)."""
    add_options(p, **{"d_model": 256, "heads": 8, "layers": 4, "ff": 1024, "seed": 0, "warmup": 50,
                      "lr": 1e-3, "weight_decay": 0.01, "epochs": 2, "batch": 16, "dropout": 0.1,
                      **defaults})
    p.add_argument("--clip", type=float, default=1.0, help="0: no clipping")
    p.add_argument("--threads", type=int, default=threads, help="torch's threads")


def train_step(model, opt, x, y, clip=0.0, sched=None, autocast=contextlib.nullcontext,
               loss_fn=F.cross_entropy):
    """One step as kiln's trainer takes it (the gradient norm clipped to `clip`; 0: none)."""
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
    """Adds a batch's summed loss, right answers and judged elements to `sums`."""
    out = model(x).float()
    sums[0] += F.cross_entropy(out, y, reduction="sum").item()
    sums[1] += (out.argmax(1) == y).sum().item()
    sums[2] += y.numel()


def scores(model, batches, autocast=contextlib.nullcontext, add=add_scores):
    """Mean loss and accuracy over `batches` of (x, y) in eval mode, each batch's sums by `add`."""
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
    """A LightningModule class training `model` with `loss_fn`, clipped to `clip` (0: none)."""
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
            # Lightning refuses `gradient_clip_val` with a fused optimizer under mixed precision;
            # with bf16 there is no scaler, so clipping in this documented hook is exact.
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(self.parameters(), clip)

    return Module


def save_program(model, example, path):
    """`model` (train mode) exported with a dynamic batch, as a user ships it, saved at `path`."""
    shapes = ({0: torch.export.Dim("batch")},)
    torch.export.save(torch.export.export(model.train(), (example,), dynamic_shapes=shapes), path)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device):
    """(MiB, what) of the peak memory so far."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda allocator peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS"


def timed(n, step, results):
    """Seconds of each of n calls of step, whose results go to `results`."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        results.append(step())
        times.append(time.perf_counter() - t0)
    return times


def inductor_cache():
    """"cold" if inductor's caches (its directory, its headers) are empty, "warm" if not; without
    TORCHINDUCTOR_CACHE_DIR, "inductor's default directory (may be warm)"."""
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not path:
        return "inductor's default directory (may be warm)"
    dirs = [path]
    with contextlib.suppress(ImportError):  # another torch layout: the cache directory alone
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        dirs.append(os.path.join(default_cache_dir(), "precompiled_headers"))
    return "cold" if all(not os.path.isdir(p) or not os.listdir(p) for p in dirs) else "warm"


def not_run(error, **fields):
    """The JSON of a --compile run that could not compile here (`fields` say what it was)."""
    reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
    if len(reason) > 300:
        reason = reason[:297] + "..."
    log(f"torch.compile did not run: {reason}")
    return {"framework": "pytorch-compile", "torch_version": torch.__version__, **fields,
            "not_run": f"torch.compile failed: {reason}"}
