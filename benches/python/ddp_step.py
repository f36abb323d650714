"""PyTorch's side of kiln's data-parallel benchmark (`cargo xtask bench --suite ddp`).

Trains kiln's transformer reference model (train_step.py's SignTransformer, kiln's twin:
[B, S, F], --seq, --d-model, --heads, --layers, --ff; SDPA attention) in fp32 on the CPU, the
way a PyTorch user writes it: launched by `python -m torch.distributed.run --nproc-per-node 2
...`, each rank joins a Gloo process group and wraps the model in
`torch.nn.parallel.DistributedDataParallel` with kiln's gradient buckets (--bucket-cap-mb,
--first-bucket-mb: DDP's defaults, 25 and 1 MiB, or one size for both, what DDP's bucket_cap_mb
gives); run as plain `python ddp_step.py ...` (no WORLD_SIZE), the same loop trains alone
without DDP, the 1-rank reference.

The data are kiln's own synthetic samples, written by the suite as .npy files (float32 features
[N, S, F], int64 labels [N]) and held in memory. Each epoch a `DistributedSampler` (shuffled,
seeded, drop_last) deals every rank its share, cut into batches of --batch by indexing the
in-memory tensors (no DataLoader workers).

One step, as kiln's trainer does it: take the batch, forward, cross-entropy (mean), zero_grad,
backward (DDP averages the gradients over the ranks during it), clip the global gradient norm
(--clip; 0 = off), fused AdamW (weight decay on parameters with dim >= 2 only), kiln's warmup +
cosine schedule, and the loss added to a running sum without a host sync. Each step is timed
with time.perf_counter from before taking the batch to after the schedule step; the mean step
time is over every step, as kiln's summary counts it. At the end of each epoch the epoch's mean
train loss is averaged over the ranks (kiln's final train loss).

With --export-program PATH it trains nothing: it saves the model (as built, in train mode) as a
torch.export program with a dynamic batch dimension, as a user ships it, for the suite's rows of
kiln training that program through its compiled step.

After training, a DDP run times a bare Gloo all-reduce of as many float32 values as the model has
parameters (what a step must communicate). Rank 0 prints one JSON line on stdout: steps, mean step
time, global samples/s (all ranks' samples over rank 0's step time), the final train loss, that
all-reduce time; human text goes to stderr.
"""

import argparse
import json
import os
import sys
import time

from common import add_training_args, log, optimizer, read_npy, save_program, train_step
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

# kiln's transformer in PyTorch, as the train-step suite defines it (this directory is on
# sys.path: the script's own, under plain python and torch.distributed.run alike).
from train_step import SignTransformer  # noqa: E402


def build(a):
    """The transformer, initialised from --seed (kiln's models initialise as these do)."""
    torch.manual_seed(a.seed)
    return SignTransformer(a.features, a.seq, a.d_model, a.heads, a.layers, a.ff, a.classes,
                           a.dropout)


def wrap(model, a):
    """DistributedDataParallel with kiln's buckets. DDP's own defaults are a 25 MiB cap with a
    1 MiB first bucket; an explicit bucket_cap_mb caps the first bucket too."""
    if (a.bucket_cap_mb, a.first_bucket_mb) == (25.0, 1.0):
        return nn.parallel.DistributedDataParallel(model)
    if a.first_bucket_mb != a.bucket_cap_mb:
        raise SystemExit(f"error: DDP takes its defaults (25 and 1 MiB) or one bucket size for "
                         f"all buckets, not {a.bucket_cap_mb} with a first of {a.first_bucket_mb}")
    return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb)


def train(a, world, rank, model, features, labels):
    """The training loop; returns (steps, summed step seconds, final train loss)."""
    sampler = DistributedSampler(range(len(labels)), num_replicas=world, rank=rank,
                                 shuffle=True, seed=a.seed, drop_last=True)
    per_epoch = len(sampler) // a.batch
    opt, sched = optimizer(model, a, per_epoch * a.epochs)
    steps, step_seconds, final_loss = 0, 0.0, float("nan")
    model.train()
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.int64)
        loss_sum = torch.zeros((), dtype=torch.float64)
        for b in range(per_epoch):
            started = time.perf_counter()
            idx = order[b * a.batch:(b + 1) * a.batch]
            x, y = features.index_select(0, idx), labels.index_select(0, idx)
            loss = train_step(model, opt, x, y, a.clip, sched)
            loss_sum += loss.detach().double() * len(y)
            step_seconds += time.perf_counter() - started
            steps += 1
        mean = loss_sum / (per_epoch * a.batch)
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        final_loss = mean.item()
        log(f"rank {rank}: epoch {epoch}: {per_epoch} steps, train loss {final_loss:.4f}")
    return steps, step_seconds, final_loss


def export_program(a):
    """The model, as built, exported in train mode with a dynamic batch and saved."""
    model = build(a)
    save_program(model, torch.zeros(2, a.seq, a.features), a.export_program)
    print(json.dumps({"exported": a.export_program,
                      "parameters": sum(p.numel() for p in model.parameters())}), flush=True)


def allreduce_ms(numel, repeats=50):
    """The mean time of one Gloo all-reduce of `numel` float32 values (the gradient's size),
    after a few untimed ones: the communication a DDP step cannot do without."""
    t = torch.zeros(numel)
    for _ in range(5):
        dist.all_reduce(t)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(t)
    return (time.perf_counter() - started) / repeats * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--features-file", required=True, help="float32 [N, S, F] .npy")
    p.add_argument("--labels-file", required=True, help="int64 [N] .npy")
    for name, help in (("--samples", "the first N samples of the files"), ("--classes", None),
                       ("--features", "per position")):
        p.add_argument(name, type=int, required=True, help=help)
    for name, default, help in (("--seq", 64, "sequence length"),
                                ("--bucket-cap-mb", 25.0, "DDP's gradient buckets"),
                                ("--first-bucket-mb", 1.0, None)):
        p.add_argument(name, type=type(default), default=default, help=help)
    # --batch per rank; --threads intra- and inter-op, per rank.
    add_training_args(p, threads=1, epochs=1, batch=None, dropout=0.0)
    p.add_argument("--export-program", metavar="PATH", default=None,
                   help="save the model as a torch.export program and exit")
    a = p.parse_args()
    if a.export_program:
        return export_program(a)
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    features = read_npy(a.features_file, (a.samples, a.seq, a.features))
    labels = read_npy(a.labels_file, (a.samples,))
    model = wrap(build(a), a) if world > 1 else build(a)
    started = time.perf_counter()
    steps, step_seconds, final_loss = train(a, world, rank, model, features, labels)
    fit_seconds = time.perf_counter() - started
    parameters = sum(p.numel() for p in model.parameters())
    comm_ms = allreduce_ms(parameters) if world > 1 else None
    if rank == 0:
        print(json.dumps({
            "framework": "pytorch-ddp" if world > 1 else "pytorch",
            "torch_version": torch.__version__, "world_size": world,
            "threads": torch.get_num_threads(), "batch_per_rank": a.batch, "model": "transformer",
            "bucket_cap_mb": a.bucket_cap_mb, "first_bucket_mb": a.first_bucket_mb,
            "epochs": a.epochs, "steps": steps, "samples": steps * a.batch * world,
            "mean_step_time_s": step_seconds / max(1, steps),
            "samples_per_s": steps * a.batch * world / step_seconds if step_seconds else 0.0,
            "final_train_loss": final_loss, "fit_seconds": fit_seconds,
            "parameters": parameters, "gradient_allreduce_ms": comm_ms,
        }), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
        # Interpreter finalization with Gloo's worker threads still about aborts now and then
        # ("terminate called without an active exception", SIGABRT; pytorch/pytorch#179291):
        # the figures are out, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
