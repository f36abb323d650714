"""PyTorch's side of kiln's offline inference benchmark: kiln's reference MLP (784 -> 1024 -> 1024
-> 10, random weights in --precision) run over batches in plain PyTorch (eval, --grad-mode, eager or
--compile, each batch to the device and back as fp32); prints one JSON line on stdout.
"""

import statistics
import time

from common import (at_least, emit, inductor_cache, log, not_run, parser, peak_memory,
                    set_threads, sync)
import torch  # noqa: E402

from train_step import MLP  # noqa: E402 - kiln's reference MLP, beside this script


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[i]


def run(a, forward, device, dtype):
    """Every batch's wall time (warm-up first), host input to fp32 host output."""
    host = torch.randn(a.batch, 784)
    times = []
    with getattr(torch, a.grad_mode)():  # torch.inference_mode or torch.no_grad
        for _ in range(a.warmup + a.batches):
            sync(device)
            t0 = time.perf_counter()
            out = forward(host.to(device=device, dtype=dtype)).float().to("cpu", copy=True)
            sync(device)
            times.append(time.perf_counter() - t0)
    assert out.shape == (a.batch, 10)
    return times


def main():
    # --batches: the timed batches; --warmup: at least 1, as the first batch is reported apart.
    positive = at_least(1)
    p = parser(__doc__, batch=(positive, 64), batches=(positive, 200), warmup=(positive, 20),
               threads=(int, None), seed=0, device="cpu", precision=["fp32", "bf16", "fp16"],
               grad_mode=["inference_mode", "no_grad"])
    p.add_argument("--compile", action="store_true", help="run torch.compile(model)")
    a = p.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: this torch sees no CUDA device")
    set_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision, torch.float32)
    model = MLP(784, [1024, 1024], 10, dropout=0.0).to(device=device, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    cache = inductor_cache() if a.compile else None
    try:
        all_times = run(a, torch.compile(model) if a.compile else model, device, dtype)
    except Exception as e:  # noqa: BLE001 - any compile failure becomes the row's reason
        if not a.compile:
            raise
        return emit(not_run(e, device=a.device, precision=a.precision, batch=a.batch))
    times = all_times[a.warmup:]
    ordered = sorted(times)
    memory, memory_kind = peak_memory(device)
    p50 = statistics.median(times)
    result = {
        "framework": "pytorch-compile" if a.compile else "pytorch-eager",
        "torch_version": torch.__version__, "device": a.device, "precision": a.precision,
        "weights": "fp32" if a.precision == "fp32" else f"{a.precision} (model.to, no autocast)",
        "grad_mode": a.grad_mode, "batch": a.batch, "batches": a.batches,
        "threads": torch.get_num_threads(), "params": params, "first_batch_s": all_times[0],
        "compile": {"mode": "default", "what": "torch.compile(model)",
                    "first_batch_s": all_times[0], "compile_s": max(0.0, all_times[0] - p50),
                    "inductor_cache": cache} if a.compile else None,
        "samples_per_s": a.batch * a.batches / sum(times), "p50_ms": p50 * 1e3,
        "p95_ms": percentile(ordered, 95) * 1e3, "p99_ms": percentile(ordered, 99) * 1e3,
        "peak_memory_mib": memory, "peak_memory_kind": memory_kind,
    }
    log(f"{result['framework']} {a.precision} batch {a.batch} ({a.grad_mode}): "
        f"{result['samples_per_s']:.0f} samples/s, p50 {result['p50_ms']:.3f} ms")
    emit(result)


if __name__ == "__main__":
    main()
