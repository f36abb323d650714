"""PyTorch's side of kiln's data-loader benchmark (`cargo xtask bench data`).

Reads the same kiln dataset directory (safetensors shards + kiln-dataset.json) the way a
careful PyTorch user would: each worker memory-maps the shards once (copy-on-write, zero-copy
views through torch.frombuffer), __getitem__ does the same per-sample work as kiln's loader
(convert to float32, normalize each feature of the last dimension), and
torch.utils.data.DataLoader batches with the default collate. Prints one JSON line.
"""

import argparse
import json
import mmap
import os
import struct
import sys
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # numpy is not needed
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
          "f64": torch.float64, "u8": torch.uint8, "i8": torch.int8, "i16": torch.int16,
          "i32": torch.int32, "i64": torch.int64}
ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "F64": torch.float64, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
             "I32": torch.int32, "I64": torch.int64}


def open_safetensors(path):
    """Maps a safetensors file; returns {name: tensor view} without copying."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    (n,) = struct.unpack("<Q", mm[:8])
    header = json.loads(mm[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = ST_DTYPES[info["dtype"]]
        count = (end - start) // torch.empty((), dtype=dtype).element_size()
        t = torch.frombuffer(mm, dtype=dtype, count=count, offset=8 + n + start)
        out[name] = t.view(info["shape"])
    return out


class ShardDataset(Dataset):
    def __init__(self, root, mean, std):
        with open(os.path.join(root, "kiln-dataset.json")) as f:
            self.manifest = json.load(f)
        self.root = root
        self.starts = []
        s = 0
        for shard in self.manifest["shards"]:
            self.starts.append(s)
            s += shard["samples"]
        self.len = s
        self.mean = torch.tensor(mean, dtype=torch.float32)
        self.std = torch.tensor(std, dtype=torch.float32)
        self.shards = None  # opened lazily, once per worker process

    def __len__(self):
        return self.len

    def _open(self):
        self.shards = []
        for shard in self.manifest["shards"]:
            t = open_safetensors(os.path.join(self.root, shard["features"]))
            # Manifest version 2 names the tensor `targets`; version 1 named it `labels`.
            self.shards.append((t["features"], t["targets"] if "targets" in t else t["labels"]))

    def __getitem__(self, i):
        if self.shards is None:
            self._open()
        lo, hi = 0, len(self.starts)
        while hi - lo > 1:  # the shard holding sample i
            mid = (lo + hi) // 2
            if self.starts[mid] <= i:
                lo = mid
            else:
                hi = mid
        feats, labels = self.shards[lo]
        j = i - self.starts[lo]
        x = (feats[j].to(torch.float32) - self.mean) / self.std
        return x, int(labels[j])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--norm", required=True)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--prefetch-factor", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--idle", action="store_true", help="load everything but iterate nothing")
    a = p.parse_args()
    torch.set_num_threads(1)  # as on kiln's side: the consumer's work is one small sum
    with open(a.norm) as f:
        norm = json.load(f)
    ds = ShardDataset(a.dir, norm["mean"], norm["std"])
    if a.idle:  # report, then hold still until the harness has measured (stdin closes)
        print(json.dumps({"impl": "torch", "idle": True}), flush=True)
        sys.stdin.read()
        return
    g = torch.Generator()
    g.manual_seed(a.seed)
    kwargs = {}
    if a.workers > 0:
        kwargs = {"persistent_workers": True, "prefetch_factor": a.prefetch_factor}
    start = time.perf_counter()
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, generator=g,
                        num_workers=a.workers, **kwargs)
    first = None
    samples = 0
    label_sum = 0
    feature_sum = 0.0
    for x, y in loader:
        if first is None:
            first = time.perf_counter() - start
        samples += y.shape[0]
        label_sum += int(y.sum())
        feature_sum += float(x[:, 0].sum(dtype=torch.float64))  # cheap check of the data
    seconds = time.perf_counter() - start
    print(json.dumps({"impl": "torch", "workers": a.workers, "samples": samples,
                      "seconds": seconds, "first_batch_seconds": first,
                      "label_sum": label_sum, "feature_sum": feature_sum,
                      "torch": torch.__version__, "python": sys.version.split()[0]}))


if __name__ == "__main__":
    main()
