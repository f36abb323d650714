"""PyTorch's side of kiln's same-learning check (`cargo xtask bench learning`): trains the twin of a
kiln reference model from kiln's initial weights on kiln's data as --job JOB.json describes it
(rows [i*batch mod pool, +batch) at step i, constant lr, no clipping; bf16: CPU autocast, kiln's
attention) and prints the per-step losses and the held-out loss and accuracy as one JSON line.
"""
import functools
import json
import re
import sys
import time

from common import (adamw_groups, batches, emit, open_safetensors, parser, scores, set_threads,
                    train_step)
import torch  # noqa: E402

import train_step as twins  # noqa: E402 - the twins of kiln's models, beside this script


# kiln's names of the transformer twin's tensors: (pattern on the twin's name, kiln's name); an
# encoder layer's tensors by (twin's module, kiln's) name.
LAYER_NAMES = (("ln1", "norm1"), (r"attn\.qkv", "qkv"), (r"attn\.out_proj", "out"),
               ("ln2", "norm2"), ("linear1", "ff1"), ("linear2", "ff2"))
TRANSFORMER_NAMES = [
    (r"(embed|head)\.(weight|bias)", r"\1.\2"),
    (r"pos", "positions"),
    (r"ln\.(weight|bias)", r"norm.\1"),
    *((rf"layers\.(\d+)\.{twin}\.(weight|bias)", rf"layer\1.{kiln}.\2")
      for twin, kiln in LAYER_NAMES),
]


def kiln_name(kind, model, name):
    """The name kiln gives the twin's tensor `name`, or an error naming it."""
    if kind == "transformer":
        for pattern, replacement in TRANSFORMER_NAMES:
            if re.fullmatch(pattern, name):
                return re.sub(pattern, replacement, name)
    elif kind == "mlp":
        m = re.fullmatch(r"net\.(\d+)\.(weight|bias)", name)
        if m:
            index, last = int(m.group(1)), len(model.net) - 1
            return f"{'head' if index == last else f'fc{index // 3}'}.{m.group(2)}"
    elif kind == "unet3d":  # the twin is built under kiln's names
        return name
    else:  # convnet: features = [conv, bn, relu] per stage, then the head
        m = re.fullmatch(r"features\.(\d+)\.(weight|bias|running_mean|running_var)", name)
        if m:
            stage, role = divmod(int(m.group(1)), 3)
            if role in (0, 1):
                return f"{['conv', 'bn'][role]}{stage}.{m.group(2)}"
        if re.fullmatch(r"head\.(weight|bias)", name):
            return name
    raise SystemExit(f"error: {kind} twin tensor `{name}` has no kiln name in the map")


def load_kiln_weights(kind, model, path):
    """Copies kiln's weights into the twin, each tensor exactly once; returns how many."""
    weights = open_safetensors(path)
    used = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if name.endswith("num_batches_tracked"):
            continue
        kiln = kiln_name(kind, model, name)
        if kiln in used:
            raise SystemExit(f"error: {path}: {kiln} would load both {used[kiln]} and {name}")
        if kiln not in weights:
            raise SystemExit(f"error: {path} has no tensor {kiln} (for the twin's {name})")
        source = weights[kiln]
        if tuple(source.shape) != tuple(t.shape):
            raise SystemExit(f"error: {path}: {kiln} has shape {list(source.shape)}, the twin's "
                             f"{name} {list(t.shape)}")
        with torch.no_grad():
            t.copy_(source)
        used[kiln] = name
    unused = sorted(set(weights) - set(used))
    if unused:
        raise SystemExit(f"error: {path}: kiln tensors no twin tensor took: {', '.join(unused)}")
    return len(used)


def build(job, math_attention):
    c, kind = job["twin"], job["model"]
    if kind == "transformer":
        return twins.SignTransformer(c["features"], c["seq"], c["d_model"], c["heads"],
                                     c["layers"], c["ff"], c["classes"], 0.0, math_attention)
    if kind == "mlp":
        return twins.MLP(c["features"], c["hidden"], c["classes"], 0.0)
    if kind == "unet3d":
        return twins.UNet3d(c["in_channels"], c["channels"], c["classes"])
    if kind != "convnet":
        raise SystemExit(f"error: {kind} has no twin here")
    if tuple(c["channels"]) != tuple(twins.CONV_CHANNELS):
        raise SystemExit(f"error: the convnet twin has channels {twins.CONV_CHANNELS}, kiln's "
                         f"{c['channels']}")
    return twins.ConvNet(c["in_channels"], c["classes"])


def main():
    p = parser(__doc__, precision=["fp32", "bf16"], threads=(int, None))
    p.add_argument("--job", required=True, help="the job file kiln-bench learning wrote")
    a = p.parse_args()
    set_threads(a.threads)
    start = time.perf_counter()
    with open(a.job) as f:
        job = json.load(f)
    bf16 = a.precision == "bf16"
    model = build(job, math_attention=bf16)
    loaded = load_kiln_weights(job["model"], model, job["init"])
    data = {name: t.clone() for name, t in open_safetensors(job["data"]).items()}
    x, y = data["train_x"], data["train_y"]
    groups = adamw_groups(list(model.parameters()), job["weight_decay"])
    opt = torch.optim.AdamW(groups, lr=job["lr"], betas=tuple(job["betas"]), eps=job["eps"],
                            fused=True)
    autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16, enabled=bf16)
    batch, pool = job["batch"], len(y)
    losses = []
    model.train()
    for step in range(job["steps"]):
        first = step * batch % pool
        rows = slice(first, first + batch)
        losses.append(train_step(model, opt, x[rows], y[rows], autocast=autocast).item())
    held = batches(data["held_x"], data["held_y"], job["eval_batch"])
    loss, accuracy = scores(model, held, autocast)
    emit({"framework": "pytorch", "torch_version": torch.__version__, "model": job["model"],
          "precision": a.precision,
          "attention": "math" if bf16 and job["model"] == "transformer" else "sdpa",
          "threads": torch.get_num_threads(), "tensors_loaded": loaded, "losses": losses,
          "held_out_loss": loss, "held_out_accuracy": accuracy,
          "seconds": time.perf_counter() - start})


if __name__ == "__main__":
    sys.exit(main())
