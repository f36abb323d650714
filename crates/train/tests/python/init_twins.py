"""PyTorch's side of kiln's initialisation tests.

  init_twins.py models OUT SEEDS...   the twins of kiln's reference models (benches/python/
                                      train_step.py), built after torch.manual_seed(seed), their
                                      tensors under kiln's names in OUT/<model>-<seed>.safetensors
  init_twins.py layers OUT SEEDS...   min, max, mean and variance of every parameter of PyTorch's
                                      default nn.Linear, nn.Conv2d, nn.LayerNorm, nn.BatchNorm2d and
                                      nn.Embedding, drawn once per seed, as OUT/layers.json
"""
import array
import importlib.util
import json
import os
import sys

import struct

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
TWINS = os.path.join(HERE, "..", "..", "..", "..", "benches", "python", "train_step.py")


def twins():
    # train_step.py imports its neighbour common.py.
    sys.path.insert(0, os.path.dirname(os.path.abspath(TWINS)))
    spec = importlib.util.spec_from_file_location("train_step", TWINS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kiln_names(kind, model):
    """The model's tensors (parameters and buffers) under the names kiln gives them."""
    out = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith("num_batches_tracked"):
            continue
        parts = name.split(".")
        if kind == "mlp":
            index = int(parts[1])
            last = len(model.net) - 1
            layer = "head" if index == last else f"fc{index // 3}"
            out[f"{layer}.{parts[2]}"] = t
        elif kind == "transformer":
            if parts[0] == "pos":
                out["positions"] = t
            elif parts[0] == "layers":
                sub = {"ln1": "norm1", "ln2": "norm2", "linear1": "ff1", "linear2": "ff2",
                       "attn": None}[parts[2]]
                if sub is None:
                    sub = {"qkv": "qkv", "out_proj": "out"}[parts[3]]
                out[f"layer{parts[1]}.{sub}.{parts[-1]}"] = t
            else:
                out[{"ln": "norm"}.get(parts[0], parts[0]) + "." + parts[-1]] = t
        elif kind == "unet3d":  # the twin is built under kiln's names
            out[name] = t
        else:  # convnet: features = [conv, bn, relu] per stage
            if parts[0] == "features":
                stage, role = divmod(int(parts[1]), 3)
                out[f"{['conv', 'bn'][role]}{stage}.{parts[2]}"] = t
            else:
                out[name] = t
    return {k: v.detach().contiguous() for k, v in out.items()}


def save_file(tensors, path):
    """f32 tensors as a safetensors file (header length, JSON header, data), written here so that
    nothing beyond torch is needed."""
    header, blobs, offset = {}, [], 0
    for name, t in sorted(tensors.items()):
        data = array.array("f", t.to(torch.float32).flatten().tolist()).tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def models(out_dir, seeds):
    m = twins()
    for seed in seeds:
        for kind, build in [
            ("mlp", lambda: m.MLP(64, [256, 256], 10, 0.1)),
            ("transformer", lambda: m.SignTransformer(469, 64, 256, 8, 4, 1024, 100, 0.1)),
            ("convnet", lambda: m.ConvNet(3, 10)),
            ("unet3d", lambda: m.UNet3d(1, [16, 32, 64], 2)),
        ]:
            torch.manual_seed(seed)
            save_file(kiln_names(kind, build()), os.path.join(out_dir, f"{kind}-{seed}.safetensors"))


LAYERS = {
    "linear": lambda: nn.Linear(37, 50),
    "conv2d": lambda: nn.Conv2d(6, 8, 3, groups=2, bias=True),
    "layer_norm": lambda: nn.LayerNorm(20),
    "batch_norm2d": lambda: nn.BatchNorm2d(9),
    "embedding": lambda: nn.Embedding(30, 16),
}


def layers(out_dir, seeds):
    drawn = {}
    for kind, build in LAYERS.items():
        for seed in seeds:
            torch.manual_seed(seed)
            layer = build()
            for name, t in list(layer.named_parameters()) + list(layer.named_buffers()):
                if not name.endswith("num_batches_tracked"):
                    drawn.setdefault(f"{kind}.{name}", []).append(t.detach().flatten().double())
    stats = {}
    for key, parts in drawn.items():
        x = torch.cat(parts)
        stats[key] = {"min": x.min().item(), "max": x.max().item(), "mean": x.mean().item(),
                      "var": x.var(unbiased=False).item(), "count": x.numel()}
    with open(os.path.join(out_dir, "layers.json"), "w") as f:
        json.dump(stats, f)


if __name__ == "__main__":
    what, out_dir, seeds = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
    {"models": models, "layers": layers}[what](out_dir, seeds)
