"""PyTorch's side of kiln's data-loader benchmark (`cargo xtask bench data`): kiln's dataset
directory (safetensors shards) read and normalized with a DataLoader, --fetch item (__getitem__ and
default_collate) or batch (__getitems__); times the first batch, each epoch and the per-batch work
inline; prints one JSON line.
"""

import bisect
import itertools
import json
import math
import os
import sys
import time

from common import emit, open_safetensors, parser
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data._utils.collate import default_collate  # noqa: E402

BREAKDOWN_BATCHES = 8  # batches timed inline for the per-batch breakdown


class ShardDataset(Dataset):
    """The PyTorch default: one sample per __getitem__, batched by the default collate."""

    def __init__(self, root, mean, std):
        with open(os.path.join(root, "kiln-dataset.json")) as f:
            self.manifest = json.load(f)
        self.root = root
        counts = [shard["samples"] for shard in self.manifest["shards"]]
        self.starts = [0, *itertools.accumulate(counts)][:-1]
        self.len = sum(counts)
        self.mean = torch.tensor(mean, dtype=torch.float32)
        self.std = torch.tensor(std, dtype=torch.float32)
        self.shards = None  # opened lazily, once per worker process

    def __len__(self):
        return self.len

    def opened(self):
        """Each shard's (features, labels), mapped on first use."""
        if self.shards is None:
            self.shards = []
            for shard in self.manifest["shards"]:
                t = open_safetensors(os.path.join(self.root, shard["features"]))
                # Manifest version 2 names the tensor `targets`; version 1 named it `labels`.
                self.shards.append((t["features"], t["targets"] if "targets" in t else t["labels"]))
        return self.shards

    def sample(self, i):
        """Sample i as stored: a view of its features in the mapped shard, and its label."""
        if self.shards is None:
            self.opened()
        s = bisect.bisect_right(self.starts, i) - 1  # the shard holding sample i
        feats, labels = self.shards[s]
        return feats[i - self.starts[s]], int(labels[i - self.starts[s]])

    def __getitem__(self, i):
        x, y = self.sample(i)
        return (x.to(torch.float32) - self.mean) / self.std, y


class BatchedShardDataset(ShardDataset):
    """Batched fetch: (features, labels, __getitems__ calls so far, pid), grouped by shard."""

    def __init__(self, root, mean, std):
        super().__init__(root, mean, std)
        self.starts_t = torch.tensor(self.starts, dtype=torch.int64)
        self.calls = 0

    def __getitem__(self, i):
        raise RuntimeError("batched fetch must go through __getitems__")

    def __getitems__(self, indices):
        shards = self.opened()
        self.calls += 1
        idx = torch.as_tensor(indices, dtype=torch.int64)
        shard = torch.searchsorted(self.starts_t, idx, right=True) - 1
        shard, order = torch.sort(shard, stable=True)
        idx = idx[order]
        sample_shape = shards[0][0].shape[1:]
        x = batch_tensor((len(indices), *sample_shape), torch.float32)
        y = batch_tensor((len(indices),), torch.int64)
        ids, counts = torch.unique_consecutive(shard, return_counts=True)
        at = 0
        for s, n in zip(ids.tolist(), counts.tolist()):
            feats, labels = shards[s]
            local = idx[at:at + n] - self.starts[s]
            first = int(local[0])
            if n == 1 or bool((local[1:] - local[:-1] == 1).all()):  # a contiguous run
                x[at:at + n].copy_(feats[first:first + n])
                y[at:at + n].copy_(labels[first:first + n])
            else:
                torch.index_select(feats, 0, local, out=x[at:at + n])
                torch.index_select(labels, 0, local, out=y[at:at + n])
            at += n
        x.sub_(self.mean).div_(self.std)
        return x, y, self.calls, os.getpid()


def batch_tensor(shape, dtype):
    """An empty batch tensor; in a worker, in shared memory as default_collate makes it."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(math.prod(shape))
    return torch.empty(0, dtype=dtype).new(storage).view(shape)


def identity(batch):  # collate_fn for batched fetch: __getitems__ made the batch
    return batch


def breakdown(ds, batch_size, seed):
    """Per-batch work timed inline in this process over a few shuffled batches, in ms."""
    ds.opened()  # map the shards before timing (with workers, this process has not yet)
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    batches = [perm[k * batch_size:(k + 1) * batch_size] for k in range(BREAKDOWN_BATCHES)]
    batches = [b for b in batches if b]
    fetch = collate = 0.0
    for b in batches:
        t0 = time.perf_counter()
        data = ds.__getitems__(b) if isinstance(ds, BatchedShardDataset) else [ds[i] for i in b]
        t1 = time.perf_counter()
        if not isinstance(ds, BatchedShardDataset):
            default_collate(data)
        t2 = time.perf_counter()
        fetch += t1 - t0
        collate += t2 - t1
    n = max(len(batches), 1)
    return {"fetch_ms_per_batch": fetch / n * 1e3, "collate_ms_per_batch": collate / n * 1e3}


def run_epochs(loader, epochs, batched):
    """Iterates `epochs` epochs; returns the timings, checksums and __getitems__ call count."""
    out = {"first_batch_seconds": None, "epoch_seconds": [], "wait_seconds": [],
           "samples": 0, "batches": 0, "label_sum": 0, "feature_sum": 0.0}
    calls = {}
    start = time.perf_counter()
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        wait = 0.0
        it = iter(loader)
        while True:
            t0 = time.perf_counter()
            item = next(it, None)
            if item is None:
                break
            wait += time.perf_counter() - t0
            if out["first_batch_seconds"] is None:
                out["first_batch_seconds"] = time.perf_counter() - start
            x, y = item[0], item[1]
            if batched:
                calls[item[3]] = max(calls.get(item[3], 0), item[2])
            out["samples"] += y.shape[0]
            out["batches"] += 1
            out["label_sum"] += int(y.sum())
            out["feature_sum"] += float(x[:, 0].sum(dtype=torch.float64))  # a cheap data check
        out["epoch_seconds"].append(time.perf_counter() - epoch_start)
        out["wait_seconds"].append(wait)
    out["getitems_calls"] = sum(calls.values()) if batched else None
    return out, start


def main():
    p = parser(__doc__, dir=str, norm=str, workers=0, batch_size=64, prefetch_factor=2, epochs=2,
               seed=0, threads=1, fetch=["item", "batch"])
    p.add_argument("--idle", action="store_true", help="load everything but iterate nothing")
    a = p.parse_args()
    torch.set_num_threads(a.threads)  # this process's ops (kiln's side: the same count)
    with open(a.norm) as f:
        norm = json.load(f)
    batched = a.fetch == "batch"
    ds = (BatchedShardDataset if batched else ShardDataset)(a.dir, norm["mean"], norm["std"])
    if a.idle:  # report, then hold still until the harness has measured (stdin closes)
        emit({"impl": "torch", "idle": True})
        sys.stdin.read()
        return
    kwargs = {"collate_fn": identity} if batched else {}
    if a.workers > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=a.prefetch_factor)
    g = torch.Generator().manual_seed(a.seed)
    t0 = time.perf_counter()
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, generator=g,
                        num_workers=a.workers, pin_memory=False, **kwargs)
    res, start = run_epochs(loader, a.epochs, batched)
    res["epoch_seconds"][0] += start - t0  # the first epoch includes building the loader
    res["first_batch_seconds"] += start - t0
    res.update(impl="torch", fetch=a.fetch, workers=a.workers, epochs=a.epochs,
               samples_per_epoch=res["samples"] // max(a.epochs, 1),
               breakdown=breakdown(ds, a.batch_size, a.seed),
               torch=torch.__version__, python=sys.version.split()[0])
    emit(res)


if __name__ == "__main__":
    main()
