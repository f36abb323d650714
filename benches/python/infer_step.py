"""PyTorch's side of kiln's offline inference benchmark.

Times what an ML engineer writes in plain PyTorch eager mode to run a trained classifier over
batches: model.eval(), torch.inference_mode(), each batch copied from host memory to the device
(and cast to the model's precision), the forward pass, and the outputs copied back to host
memory as fp32. The model is kiln's reference MLP: Linear(784,1024) -> ReLU -> Dropout ->
Linear(1024,1024) -> ReLU -> Dropout -> Linear(1024,10) with random weights; --precision bf16
or fp16 converts the weights once, as kiln's engine does.

Prints one JSON line on stdout (throughput, per-batch latency percentiles, peak memory); human
text goes to stderr.
"""

import argparse
import json
import resource
import statistics
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is not needed
import torch  # noqa: E402
from torch import nn  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def percentile(sorted_values, q):
    """Nearest-rank percentile of an ascending list."""
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[i]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=200, help="timed batches")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    for name in ("batch", "batches"):
        if getattr(a, name) <= 0:
            p.error(f"--{name} must be positive, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup must be >= 0, got {a.warmup}")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: this torch sees no CUDA device")
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision, torch.float32)
    model = nn.Sequential(
        nn.Linear(784, 1024), nn.ReLU(), nn.Dropout(0.0),
        nn.Linear(1024, 1024), nn.ReLU(), nn.Dropout(0.0),
        nn.Linear(1024, 10),
    ).to(device=device, dtype=dtype).eval()
    params = sum(p.numel() for p in model.parameters())
    host = torch.randn(a.batch, 784)
    times = []
    with torch.inference_mode():
        for i in range(a.warmup + a.batches):
            sync(device)
            t0 = time.perf_counter()
            out = model(host.to(device=device, dtype=dtype)).float().to("cpu", copy=True)
            sync(device)
            if i >= a.warmup:
                times.append(time.perf_counter() - t0)
    assert out.shape == (a.batch, 10)
    total = sum(times)
    ordered = sorted(times)
    if device.type == "cuda":
        memory, memory_kind = torch.cuda.max_memory_allocated(device) / 2**20, "cuda allocator peak"
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        memory_kind = "process peak RSS"
    result = {
        "framework": "pytorch-eager",
        "torch_version": torch.__version__,
        "device": a.device,
        "precision": a.precision,
        "batch": a.batch,
        "batches": a.batches,
        "threads": torch.get_num_threads(),
        "params": params,
        "samples_per_s": a.batch * a.batches / total,
        "p50_ms": statistics.median(times) * 1e3,
        "p95_ms": percentile(ordered, 95) * 1e3,
        "p99_ms": percentile(ordered, 99) * 1e3,
        "peak_memory_mib": memory,
        "peak_memory_kind": memory_kind,
    }
    print(f"{a.precision} batch {a.batch}: {result['samples_per_s']:.0f} samples/s, "
          f"p50 {result['p50_ms']:.3f} ms", file=sys.stderr)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
