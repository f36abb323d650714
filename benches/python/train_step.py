"""PyTorch's side of kiln's train-step benchmark.

Times the training step an ML engineer writes in plain PyTorch eager mode (or, with --compile,
under torch.compile) on the CPU or CUDA, for the same three reference models kiln implements in
Rust (same parameter shapes, same op sequence):

  mlp          [B, 64] -> Linear(64,256) -> ReLU -> Dropout -> Linear(256,256) -> ReLU -> Dropout
               -> Linear(256,10)
  transformer  a pre-norm "SignTransformer": [B, 64, 469] -> Linear(469,256) + learned positional
               embedding [64,256] -> Dropout -> 4 x (x + Drop(OutProj(MHSA(LN1(x)))),
               h + Drop(Linear2(GELU(Linear1(LN2(h)))))) -> LayerNorm -> mean over seq
               -> Linear(256,100); attention: fused qkv Linear(d,3d), 8 heads,
               F.scaled_dot_product_attention without mask or attention dropout
               (--attention math|kiln: the explicit matmul-softmax product kiln uses on
               the CPU in reduced precision)
  convnet      [B, 3, 32, 32] -> 3 x (Conv3x3 no bias -> BatchNorm2d -> ReLU), channels 32/64/128,
               strides 1/2/2 -> adaptive avg pool 1x1 -> Linear(128,10)

One step is: autocast forward (bf16 when --precision bf16), cross-entropy, zero_grad(set_to_none),
backward, fused AdamW step (weight decay 0.01 on parameters with dim >= 2, 0 otherwise), and
loss.item() as a training loop that logs would. One fixed random batch is made up front;
--warmup steps run untimed, then each of --steps steps is timed with time.perf_counter.

--breakdown-steps N more steps then time each phase (forward with the loss, backward, optimizer
step with zero_grad), the device synchronised between phases. Peak memory is the CUDA allocator's
peak on a GPU, the process's peak RSS on the CPU.

--optimizer fused|foreach|single instead times AdamW.step() alone over parameters of the given
--shapes (gradients random, fixed), the three implementations torch.optim.AdamW has.

--compile wraps the model in torch.compile (default mode) as a user writes it
(`model = torch.compile(model)`; the loss, backward and the fused AdamW step stay eager). The
first step compiles the forward and backward graphs: its wall time is reported as
"first_step_s" and "compile_s" (the first step less one steady step), apart from the steady
step times. Inductor caches in $TORCHINDUCTOR_CACHE_DIR and its precompiled headers under
$TMPDIR; "inductor_cache" says whether both were empty (a cold compile, a user's first on the
machine) or not. Where compile cannot run (no C++ compiler, no Python headers, an inductor
error) the JSON says so in "not_run".

Prints one JSON line on stdout; human text goes to stderr.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

from common import adamw_groups, at_least, log, not_run, save_program
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

MODELS = ("mlp", "transformer", "convnet")
# Each model's input and output sizes, as kiln's reference models have them.
SIZES = {"mlp": {"features": 64, "hidden": [256, 256], "classes": 10},
         "transformer": {"features": 469, "classes": 100},
         "convnet": {"in_channels": 3, "image_size": 32, "classes": 10}}


# --- models ---------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self, features, hidden, classes, dropout):
        super().__init__()
        layers = []
        d = features
        for h in hidden:
            layers += [nn.Linear(d, h), nn.ReLU(), nn.Dropout(dropout)]
            d = h
        layers.append(nn.Linear(d, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class SelfAttention(nn.Module):
    def __init__(self, d_model, heads, math_attention):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # The explicit matmul-softmax product instead of SDPA (`--attention`): what kiln's
        # transformer computes on the CPU under bf16/fp16 autocast.
        self.math = math_attention

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=-1))
        if self.math:
            scale = 1.0 / math.sqrt(d // self.heads)
            a = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v
        else:
            a = F.scaled_dot_product_attention(q, k, v)  # no mask, no attention dropout
        a = a.transpose(1, 2).reshape(b, s, d)
        return self.out_proj(a)


class EncoderLayer(nn.Module):
    def __init__(self, d_model, heads, ff, dropout, math_attention):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = SelfAttention(d_model, heads, math_attention)
        self.drop1 = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.linear1 = nn.Linear(d_model, ff)
        self.gelu = nn.GELU()  # exact (erf)
        self.linear2 = nn.Linear(ff, d_model)
        self.drop2 = nn.Dropout(dropout)

    def forward(self, x):
        h = x + self.drop1(self.attn(self.ln1(x)))
        return h + self.drop2(self.linear2(self.gelu(self.linear1(self.ln2(h)))))


class SignTransformer(nn.Module):
    def __init__(self, features, seq, d_model, heads, layers, ff, classes, dropout,
                 math_attention=False):
        super().__init__()
        self.embed = nn.Linear(features, d_model)
        self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(
            [EncoderLayer(d_model, heads, ff, dropout, math_attention) for _ in range(layers)])
        self.ln = nn.LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x):
        x = self.drop(self.embed(x) + self.pos)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x).mean(dim=1))


CONV_CHANNELS = (32, 64, 128)
CONV_STRIDES = (1, 2, 2)


class ConvNet(nn.Module):
    def __init__(self, in_channels, classes):
        super().__init__()
        layers = []
        c = in_channels
        for out, stride in zip(CONV_CHANNELS, CONV_STRIDES):
            layers += [nn.Conv2d(c, out, 3, stride=stride, padding=1, bias=False),
                       nn.BatchNorm2d(out), nn.ReLU()]
            c = out
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.features(x)), 1))


class UNet3dBlock(nn.Module):
    """Conv3d(3³, padding 1, no bias) -> BatchNorm3d -> ReLU, twice (kiln's names)."""

    def __init__(self, in_channels, out):
        super().__init__()
        self.conv0 = nn.Conv3d(in_channels, out, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm3d(out)
        self.conv1 = nn.Conv3d(out, out, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm3d(out)

    def forward(self, x):
        x = F.relu(self.bn0(self.conv0(x)))
        return F.relu(self.bn1(self.conv1(x)))


class UNet3dUp(nn.Module):
    def __init__(self, deeper, width):
        super().__init__()
        self.upsample = nn.ConvTranspose3d(deeper, width, 2, stride=2)
        self.block = UNet3dBlock(2 * width, width)


class UNet3d(nn.Module):
    """kiln's unet3d: a block per level with 2x max-pooling between, 2x transposed convolutions
    up with the skip concatenated first, a 1x1x1 head. Built in kiln's order (every encoder
    block, the decoder deepest first, the head) under kiln's tensor names."""

    def __init__(self, in_channels, channels, classes):
        super().__init__()
        c = in_channels
        for i, width in enumerate(channels):
            setattr(self, f"down{i}", UNet3dBlock(c, width))
            c = width
        self.levels = len(channels)
        for i in reversed(range(self.levels - 1)):
            setattr(self, f"up{i}", UNet3dUp(channels[i + 1], channels[i]))
        self.head = nn.Conv3d(channels[0], classes, 1)

    def forward(self, x):
        skips = []
        for i in range(self.levels):
            if i > 0:
                x = F.max_pool3d(x, 2)
            x = getattr(self, f"down{i}")(x)
            skips.append(x)
        for i in reversed(range(self.levels - 1)):
            up = getattr(self, f"up{i}")
            x = up.block(torch.cat([skips[i], up.upsample(x)], 1))
        return self.head(x)


# --- forward FLOPs per sample (GEMM-like ops only: 2*m*k*n per matmul) ------------------------

def mlp_flops(a):
    dims = [a.features] + a.hidden + [a.classes]
    return sum(2 * i * o for i, o in zip(dims, dims[1:]))


def transformer_flops(a):
    d, s = a.d_model, a.seq
    per_token = 2 * (a.features * d + a.layers * (3 * d * d + d * d + 2 * d * a.ff))
    attention = a.layers * 2 * (2 * s * s * d)  # QK^T and PV, summed over heads
    head = 2 * d * a.classes  # once per sample, after the mean over seq
    return per_token * s + attention + head


def convnet_flops(a):
    total, c, h = 0, a.in_channels, a.image_size  # square images
    for out, stride in zip(CONV_CHANNELS, CONV_STRIDES):
        h = (h + 2 - 3) // stride + 1
        total += 2 * out * h * h * c * 9
        c = out
    return total + 2 * c * a.classes


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device):
    """(MiB, what) of the peak memory so far."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda allocator peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process peak RSS"


def build(a):
    """Returns (model, x, y, forward FLOPs per sample), seeded with --seed."""
    torch.manual_seed(a.seed)
    if a.model == "mlp":
        model, sample = MLP(a.features, a.hidden, a.classes, a.dropout), (a.features,)
    elif a.model == "transformer":
        model = SignTransformer(a.features, a.seq, a.d_model, a.heads, a.layers, a.ff,
                                a.classes, a.dropout, use_math_attention(a))
        sample = (a.seq, a.features)
    else:
        model = ConvNet(a.in_channels, a.classes)
        sample = (a.in_channels, a.image_size, a.image_size)
    x = torch.randn(a.batch, *sample)
    if a.channels_last:  # the convnet's (parse_args checks)
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, a.classes, (a.batch,))
    device = torch.device(a.device)
    flops = {"mlp": mlp_flops, "transformer": transformer_flops, "convnet": convnet_flops}
    return model.to(device), x.to(device), y.to(device), flops[a.model](a)


def use_math_attention(a):
    """`--attention math`, or `kiln`: the explicit product where kiln uses it (the CPU in bf16
    or fp16 autocast), SDPA elsewhere. The default, `sdpa`, is what a user writes."""
    reduced = a.precision in ("bf16", "fp16")
    return a.attention == "math" or (a.attention == "kiln" and a.device == "cpu" and reduced)


# --- benchmarks -------------------------------------------------------------------------------

def timed(n, step, results):
    """Seconds of each of n calls of step, whose results go to `results`."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        results.append(step())
        times.append(time.perf_counter() - t0)
    return times


def train_bench(a):
    model, x, y, fwd_flops = build(a)
    if a.script:
        # The same module as TorchScript (from --export-script), as kiln's `probe --script`
        # trains it: what TorchScript itself costs, apart from kiln.
        model = torch.jit.load(a.script, map_location=a.device)
        if a.jit_optimize == "off":
            # The choice kiln makes for TorchScript training on the CPU.
            torch._C._set_graph_executor_optimize(False)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(adamw_groups(list(model.parameters())), lr=1e-3, fused=True)
    forward, cache = model, None
    if a.compile:
        cache = inductor_cache()
        # default mode, as a user writes it; or --compile-mode reduce-overhead (CUDA graphs)
        forward = (torch.compile(model) if a.compile_mode == "default"
                   else torch.compile(model, mode=a.compile_mode))
    device = torch.device(a.device)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=a.precision == "fp16")
    model.train()

    def step(phases=None):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = F.cross_entropy(forward(x), y)
        if phases is not None:
            sync(device)
            t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if phases is not None:
            sync(device)
            t2 = time.perf_counter()
        scaler.step(opt)
        scaler.update()
        if phases is not None:
            sync(device)
            t3 = time.perf_counter()
            phases["forward_ms"] += (t1 - t0) * 1e3
            phases["backward_ms"] += (t2 - t1) * 1e3
            phases["optimizer_ms"] += (t3 - t2) * 1e3
        return loss.item()

    log(f"{a.model} {a.precision}: {params} parameters, batch {a.batch}, "
        f"{torch.get_num_threads()} threads; {a.warmup} warmup + {a.steps} timed steps")
    losses = []
    try:
        warmup_times = timed(a.warmup, step, losses)
    except Exception as e:  # noqa: BLE001 - any compile failure becomes the row's reason
        if not a.compile:
            raise
        return not_run(e, device=a.device, model=a.model, precision=a.precision,
                       config=model_config(a))
    times = timed(a.steps, step, losses)
    phases = {"data_wait_ms": 0.0, "forward_ms": 0.0, "backward_ms": 0.0, "optimizer_ms": 0.0}
    for _ in range(a.breakdown_steps):
        t0 = time.perf_counter()
        batch = (x, y)  # one resident batch: the data wait is fetching it, as on kiln's side
        phases["data_wait_ms"] += (time.perf_counter() - t0) * 1e3
        del batch
        losses.append(step(phases))
    breakdown = ({k: v / a.breakdown_steps for k, v in phases.items()}
                 if a.breakdown_steps else None)
    if not all(math.isfinite(v) for v in losses):
        raise SystemExit(f"error: non-finite loss during training: {losses}")
    median = statistics.median(times)
    memory, memory_kind = peak_memory(device)
    flops_per_step = 3 * fwd_flops * a.batch
    result = {
        "framework": "pytorch-compile" if a.compile else "pytorch-eager",
        "torch_version": torch.__version__, "python": sys.version.split()[0],
        "device": a.device, "model": a.model, "precision": a.precision,
        "compile": compile_info(a, cache, warmup_times, median),
        "batch": a.batch, "threads": torch.get_num_threads(), "config": model_config(a),
        "params": params, "forward_flops_per_sample": fwd_flops, "flops_per_step": flops_per_step,
        "warmup": a.warmup, "steps": a.steps,
        "first_step_s": warmup_times[0] if warmup_times else None, "warmup_step_s": warmup_times,
        "step_s_median": median, "step_s_mean": statistics.fmean(times),
        "step_s_min": min(times), "step_s_max": max(times),
        "samples_per_s": a.batch / median, "gflops": flops_per_step / median / 1e9,
        "loss_first": losses[0], "loss_last": losses[-1], "breakdown": breakdown,
        "peak_memory_mib": memory, "peak_memory_kind": memory_kind,
    }
    log(f"median {median * 1e3:.2f} ms/step, {result['samples_per_s']:.1f} samples/s, "
        f"{result['gflops']:.1f} GFLOP/s")
    return result


def inductor_cache():
    """Whether inductor's caches were empty at the start: $TORCHINDUCTOR_CACHE_DIR and the
    precompiled C++ headers (under $TMPDIR, shared by every compile on the machine). "cold" is
    a user's first compile on this machine; "warm" a later one."""
    path = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not path:
        return {"dir": None, "state": "inductor's default directory (may be warm)"}
    dirs = [path]
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
        dirs.append(os.path.join(default_cache_dir(), "precompiled_headers"))
    except ImportError:  # another torch layout: judge by the cache directory alone
        pass
    cold = all(not os.path.isdir(p) or not os.listdir(p) for p in dirs)
    return {"dir": path, "state": "cold" if cold else "warm"}


def compile_info(a, cache, warmup_times, steady):
    """The compile figures of a --compile run (None for eager)."""
    if not a.compile:
        return None
    breaks = sum(torch._dynamo.utils.counters["graph_break"].values())
    return {"mode": a.compile_mode, "what": "torch.compile(model); loss, backward, AdamW eager",
            "first_step_s": warmup_times[0], "compile_s": max(0.0, warmup_times[0] - steady),
            "inductor_cache": cache["state"], "graph_breaks": breaks}


def export(a):
    """Saves the model kiln's `probe --script` (or `--program`) trains: built as `train_bench`
    builds it (same seed, so the same initial weights), in train mode, scripted (or exported by
    torch.export with a dynamic batch dimension, as a user ships it)."""
    model, x, _, _ = build(a)
    path = a.export_script or a.export_program
    if a.export_script:
        torch.jit.script(model.train()).save(path)
    else:
        save_program(model, x[:2], path)
    return {"exported": path, "model": a.model,
            "params": sum(p.numel() for p in model.parameters()), "config": model_config(a)}


def model_config(a):
    if a.model == "mlp":
        return {**SIZES["mlp"], "dropout": a.dropout}
    if a.model == "transformer":
        return {**SIZES["transformer"], "seq": a.seq, "d_model": a.d_model, "heads": a.heads,
                "layers": a.layers, "ff": a.ff, "dropout": a.dropout,
                "attention": "math" if use_math_attention(a) else "sdpa", "compile": a.compile}
    return {**SIZES["convnet"], "channels": list(CONV_CHANNELS), "channels_last": a.channels_last}


def optimizer_bench(a):
    """AdamW.step() alone, one implementation, over parameters of the given shapes."""
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    params = [torch.nn.Parameter(torch.randn(*s, device=device)) for s in a.shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    flags = {"fused": {"fused": True}, "foreach": {"foreach": True},
             "single": {"foreach": False, "fused": False}}[a.optimizer]
    opt = torch.optim.AdamW(adamw_groups(params), lr=1e-3, **flags)
    for _ in range(a.warmup):
        opt.step()
    sync(device)

    def step():
        opt.step()
        sync(device)

    times = timed(a.steps, step, [])
    n, median = sum(p.numel() for p in params), statistics.median(times)
    log(f"AdamW ({a.optimizer}) over {len(params)} tensors, {n} parameters: "
        f"median {median * 1e3:.3f} ms/step")
    return {"framework": "pytorch-eager", "torch_version": torch.__version__, "device": a.device,
            "mode": "optimizer", "impl": a.optimizer, "tensors": len(params), "params": n,
            "threads": torch.get_num_threads(), "step_s_median": median, "step_s_min": min(times)}


# --- command line -----------------------------------------------------------------------------

def shape_list(text):
    try:
        shapes = [tuple(int(v) for v in item.strip().lower().split("x"))
                  for item in text.split(",")]
    except ValueError:
        shapes = []
    if not shapes or any(v <= 0 for dims in shapes for v in dims):
        raise argparse.ArgumentTypeError(f"expected shapes like 256x469,256, got {text!r}")
    return shapes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=MODELS, default="transformer")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    positive, count = at_least(1), at_least(0)
    for name, kind, default in (("--batch", positive, 32), ("--warmup", count, 5),
                                ("--steps", positive, 30), ("--seed", int, 0),
                                ("--seq", positive, 64), ("--d-model", positive, 256),
                                ("--heads", positive, 8), ("--layers", positive, 4),
                                ("--ff", positive, 1024)):
        p.add_argument(name, type=kind, default=default)
    p.add_argument("--threads", type=positive, default=None,
                   help="torch.set_num_threads(N); default: leave torch's choice")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--channels-last", action="store_true",
                   help="convnet: model and input in torch.channels_last")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--breakdown-steps", type=count, default=0,
                   help="extra steps timed phase by phase (default 0: no breakdown)")
    p.add_argument("--optimizer", choices=("fused", "foreach", "single"), default=None,
                   help="time AdamW.step() alone with this implementation")
    p.add_argument("--shapes", type=shape_list, default=None,
                   help="--optimizer: parameter shapes, e.g. 256x469,256,1024x256")
    p.add_argument("--attention", choices=("sdpa", "math", "kiln"), default="sdpa",
                   help="transformer attention: sdpa (default, as a user writes it), math "
                        "(explicit matmul-softmax), kiln (kiln's choice per device and precision)")
    p.add_argument("--script", metavar="PATH", default=None,
                   help="train this TorchScript file (from --export-script) instead of the module")
    p.add_argument("--jit-optimize", choices=("on", "off"), default="on",
                   help="--script: TorchScript's graph optimizations (default on, as in PyTorch)")
    p.add_argument("--export-script", metavar="PATH", default=None,
                   help="save the model (seeded, in train mode) as TorchScript at PATH and exit")
    p.add_argument("--export-program", metavar="PATH", default=None,
                   help="save the model (seeded, in train mode) as a torch.export program with "
                        "a dynamic batch at PATH and exit")
    p.add_argument("--compile", action="store_true",
                   help="train torch.compile(model) (default mode); compile time reported apart")
    p.add_argument("--compile-mode", choices=("default", "reduce-overhead"), default="default",
                   help="--compile: torch.compile's mode (reduce-overhead replays CUDA graphs)")
    a = p.parse_args(argv)

    if not 0.0 <= a.dropout < 1.0:
        p.error(f"--dropout must be in [0, 1), got {a.dropout}")
    if a.device != "cpu" and not a.device.startswith("cuda"):
        p.error(f"--device must be cpu, cuda or cuda:N, got {a.device!r}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: this torch sees no CUDA device")
    if a.compile and (a.script or a.warmup < 1):
        p.error("--compile needs --warmup >= 1 (the first step compiles) and no --script")
    if a.optimizer is not None and not a.shapes:
        p.error("--optimizer needs --shapes")
    if a.optimizer is not None:
        return a
    if a.model == "transformer" and a.d_model % a.heads != 0:
        p.error(f"--d-model ({a.d_model}) must be divisible by --heads ({a.heads})")
    if a.channels_last and a.model != "convnet":
        p.error("--channels-last only applies to --model convnet")
    vars(a).update(SIZES[a.model])
    return a


def main():
    a = parse_args()
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.export_script or a.export_program:
        result = export(a)
    elif a.optimizer is not None:
        result = optimizer_bench(a)
    else:
        result = train_bench(a)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
