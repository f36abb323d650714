"""PyTorch's side of kiln's train-step benchmark: the step a user writes in plain PyTorch (eager, or
torch.compile(model) with --compile) for the twins of kiln's reference models: autocast forward,
cross-entropy, zero_grad, backward, fused AdamW, loss.item(), on one fixed batch, timed over --steps
after --warmup, phase by phase over --breakdown-steps; --compile reports the first (compiling) step
apart, or "not_run" where it cannot compile. --optimizer times AdamW.step() alone. One JSON line.
"""

import argparse
import contextlib
import math
import statistics
import sys
import time

from common import (adamw_groups, at_least, emit, inductor_cache, log, not_run, parser,
                    peak_memory, save_program, set_threads, sync, timed)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

# Each model's input and output sizes, as kiln's reference models have them.
SIZES = {"mlp": {"features": 64, "hidden": [256, 256], "classes": 10},
         "transformer": {"features": 469, "classes": 100},
         "convnet": {"in_channels": 3, "image_size": 32, "classes": 10}}


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
        self.math = math_attention  # the explicit product kiln uses on the CPU in bf16/fp16

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(d, dim=-1))
        if self.math:
            scale = 1.0 / math.sqrt(d // self.heads)
            a = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v
        else:
            a = F.scaled_dot_product_attention(q, k, v)  # no mask, no attention dropout
        return self.out_proj(a.transpose(1, 2).reshape(b, s, d))


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
        for c, out, stride in zip((in_channels, *CONV_CHANNELS), CONV_CHANNELS, CONV_STRIDES):
            layers += [nn.Conv2d(c, out, 3, stride=stride, padding=1, bias=False),
                       nn.BatchNorm2d(out), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(CONV_CHANNELS[-1], classes)

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
    """kiln's unet3d (max-pooling down, transposed convolutions up after the skip, a 1x1x1 head),
    built in kiln's order under kiln's tensor names."""

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


def forward_flops(a):
    """Forward FLOPs per sample (GEMM-like ops only: 2*m*k*n per matmul)."""
    if a.model == "mlp":
        dims = [a.features] + a.hidden + [a.classes]
        return sum(2 * i * o for i, o in zip(dims, dims[1:]))
    if a.model == "transformer":
        d, s = a.d_model, a.seq
        per_token = 2 * (a.features * d + a.layers * (3 * d * d + d * d + 2 * d * a.ff))
        attention = a.layers * 2 * (2 * s * s * d)  # QK^T and PV, summed over heads
        return per_token * s + attention + 2 * d * a.classes  # the head after the mean over seq
    total, c, h = 0, a.in_channels, a.image_size  # square images
    for out, stride in zip(CONV_CHANNELS, CONV_STRIDES):
        h = (h + 2 - 3) // stride + 1
        total += 2 * out * h * h * c * 9
        c = out
    return total + 2 * c * a.classes


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
    return model.to(a.device), x.to(a.device), y.to(a.device), forward_flops(a)


def use_math_attention(a):
    """--attention math, or kiln: the explicit product where kiln uses it (CPU bf16/fp16)."""
    reduced = a.precision in ("bf16", "fp16")
    return a.attention == "math" or (a.attention == "kiln" and a.device == "cpu" and reduced)


def train_bench(a):
    model, x, y, fwd_flops = build(a)
    if a.script:  # the module as TorchScript (--export-script), as kiln's `probe --script` has it
        model = torch.jit.load(a.script, map_location=a.device)
        if a.jit_optimize == "off":  # kiln's choice for TorchScript training on the CPU
            torch._C._set_graph_executor_optimize(False)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(adamw_groups(list(model.parameters())), lr=1e-3, fused=True)
    forward, cache = model, None
    if a.compile:  # default mode, as a user writes it; or reduce-overhead (CUDA graphs)
        cache = inductor_cache()
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
    phases = dict.fromkeys(("data_wait_ms", "forward_ms", "backward_ms", "optimizer_ms"), 0.0)
    for _ in range(a.breakdown_steps):
        t0 = time.perf_counter()
        batch = (x, y)  # one resident batch: the data wait is fetching it, as on kiln's side
        phases["data_wait_ms"] += (time.perf_counter() - t0) * 1e3
        del batch
        losses.append(step(phases))
    if not all(math.isfinite(v) for v in losses):
        raise SystemExit(f"error: non-finite loss during training: {losses}")
    median = statistics.median(times)
    memory, memory_kind = peak_memory(device)
    flops_per_step = 3 * fwd_flops * a.batch
    # The first step compiles: compile_s is it less one steady step.
    compiled = {"mode": a.compile_mode, "what": "torch.compile(model); loss, backward, AdamW eager",
                "first_step_s": warmup_times[0], "compile_s": max(0.0, warmup_times[0] - median),
                "inductor_cache": cache,
                "graph_breaks": sum(torch._dynamo.utils.counters["graph_break"].values()),
                } if a.compile else None
    result = {
        "framework": "pytorch-compile" if a.compile else "pytorch-eager",
        "torch_version": torch.__version__, "python": sys.version.split()[0],
        "device": a.device, "model": a.model, "precision": a.precision, "compile": compiled,
        "batch": a.batch, "threads": torch.get_num_threads(), "config": model_config(a),
        "params": params, "forward_flops_per_sample": fwd_flops, "flops_per_step": flops_per_step,
        "warmup": a.warmup, "steps": a.steps,
        "first_step_s": warmup_times[0] if warmup_times else None, "warmup_step_s": warmup_times,
        "step_s_median": median, "step_s_mean": statistics.fmean(times),
        "step_s_min": min(times), "step_s_max": max(times),
        "samples_per_s": a.batch / median, "gflops": flops_per_step / median / 1e9,
        "loss_first": losses[0], "loss_last": losses[-1],
        "breakdown": {k: v / a.breakdown_steps for k, v in phases.items()}
        if a.breakdown_steps else None,
        "peak_memory_mib": memory, "peak_memory_kind": memory_kind,
    }
    log(f"median {median * 1e3:.2f} ms/step, {result['samples_per_s']:.1f} samples/s, "
        f"{result['gflops']:.1f} GFLOP/s")
    return result


def export(a):
    """Saves the model `train_bench` builds (same weights), scripted or exported, for kiln."""
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


def shape_list(text):
    with contextlib.suppress(ValueError):
        shapes = [tuple(int(v) for v in item.lower().split("x")) for item in text.split(",")]
        if all(v > 0 for dims in shapes for v in dims):
            return shapes
    raise argparse.ArgumentTypeError(f"expected shapes like 256x469,256, got {text!r}")


def parse_args(argv=None):
    positive, count = at_least(1), at_least(0)
    p = parser(__doc__, batch=(positive, 32), warmup=(count, 5), steps=(positive, 30), seed=0,
               seq=(positive, 64), d_model=(positive, 256), heads=(positive, 8),
               layers=(positive, 4), ff=(positive, 1024), dropout=0.1, threads=(positive, None),
               breakdown_steps=(count, 0), device="cpu", shapes=(shape_list, None),
               model=["transformer", "mlp", "convnet"], precision=["fp32", "bf16", "fp16"],
               attention=["sdpa", "math", "kiln"], jit_optimize=["on", "off"],
               compile_mode=["default", "reduce-overhead"])
    p.add_argument("--optimizer", choices=("fused", "foreach", "single"))  # AdamW.step() alone
    for name in ("--script", "--export-script", "--export-program"):
        p.add_argument(name, metavar="PATH", default=None)
    p.add_argument("--channels-last", action="store_true", help="convnet: channels_last layout")
    p.add_argument("--compile", action="store_true", help="train torch.compile(model)")
    a = p.parse_args(argv)
    if not 0.0 <= a.dropout < 1.0:
        p.error(f"--dropout must be in [0, 1), got {a.dropout}")
    if a.device != "cpu" and not a.device.startswith("cuda"):
        p.error(f"--device must be cpu, cuda or cuda:N, got {a.device!r}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: this torch sees no CUDA device")
    if a.compile and (a.script or a.warmup < 1):
        p.error("--compile needs --warmup >= 1 (the first step compiles) and no --script")
    if a.optimizer is not None:
        if not a.shapes:
            p.error("--optimizer needs --shapes")
        return a
    if a.model == "transformer" and a.d_model % a.heads != 0:
        p.error(f"--d-model ({a.d_model}) must be divisible by --heads ({a.heads})")
    if a.channels_last and a.model != "convnet":
        p.error("--channels-last only applies to --model convnet")
    vars(a).update(SIZES[a.model])
    return a


def main():
    a = parse_args()
    set_threads(a.threads)
    bench = optimizer_bench if a.optimizer is not None else train_bench
    emit(export(a) if a.export_script or a.export_program else bench(a))


if __name__ == "__main__":
    main()
