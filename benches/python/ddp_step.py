"""PyTorch's side of kiln's data-parallel benchmark (`cargo xtask bench --suite ddp`): the
transformer twin trained in fp32 on the CPU under `torch.distributed.run` (Gloo DDP, kiln's bucket
sizes) or alone, on kiln's samples (.npy, in memory) dealt by a seeded DistributedSampler, each step
timed, then a bare all-reduce; rank 0 prints one JSON line (or --export-program saves the model).
"""

import os
import sys
import time

from common import (add_training_args, emit, log, optimizer, parser, read_npy, save_program,
                    train_step)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

from train_step import SignTransformer  # noqa: E402 - beside this script, so on sys.path


def build(a):
    """The transformer, initialised from --seed (kiln's models initialise as these do)."""
    torch.manual_seed(a.seed)
    return SignTransformer(a.features, a.seq, a.d_model, a.heads, a.layers, a.ff, a.classes,
                           a.dropout)


def wrap(model, a):
    """DDP with kiln's buckets: DDP's defaults (25 MiB, first 1 MiB) or one size for all."""
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
    step_seconds, final_loss = 0.0, float("nan")
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
        mean = loss_sum / (per_epoch * a.batch)
        if world > 1:
            dist.all_reduce(mean)
            mean /= world
        final_loss = mean.item()
        log(f"rank {rank}: epoch {epoch}: {per_epoch} steps, train loss {final_loss:.4f}")
    return per_epoch * a.epochs, step_seconds, final_loss


def export_program(a):
    """The model, as built, exported in train mode with a dynamic batch and saved."""
    model = build(a)
    save_program(model, torch.zeros(2, a.seq, a.features), a.export_program)
    emit({"exported": a.export_program, "parameters": sum(p.numel() for p in model.parameters())})


def allreduce_ms(numel, repeats=50):
    """The mean time of one Gloo all-reduce of `numel` float32 values (the gradient's size)."""
    t = torch.zeros(numel)
    for _ in range(5):
        dist.all_reduce(t)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(t)
    return (time.perf_counter() - started) / repeats * 1e3


def main():
    # The .npy files (float32 [N, S, F], int64 [N]), the first --samples of them, the sizes.
    p = parser(__doc__, features_file=str, labels_file=str, samples=int, classes=int, features=int,
               seq=64, bucket_cap_mb=25.0, first_bucket_mb=1.0)
    # --batch per rank; --threads intra- and inter-op, per rank.
    add_training_args(p, threads=1, epochs=1, batch=int, dropout=0.0)
    p.add_argument("--export-program", metavar="PATH", help="save the model there and exit")
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
        emit({"framework": "pytorch-ddp" if world > 1 else "pytorch",
              "torch_version": torch.__version__, "world_size": world,
              "threads": torch.get_num_threads(), "batch_per_rank": a.batch, "model": "transformer",
              "bucket_cap_mb": a.bucket_cap_mb, "first_bucket_mb": a.first_bucket_mb,
              "epochs": a.epochs, "steps": steps, "samples": steps * a.batch * world,
              "mean_step_time_s": step_seconds / max(1, steps),
              "samples_per_s": steps * a.batch * world / step_seconds if step_seconds else 0.0,
              "final_train_loss": final_loss, "fit_seconds": fit_seconds,
              "parameters": parameters, "gradient_allreduce_ms": comm_ms})
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
        # Finalizing with Gloo's threads about aborts now and then (pytorch/pytorch#179291):
        # the figures are out, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
