"""gpu-check's `compiled-train` step, PyTorch's side: a small transformer classifier (two
pre-norm blocks with F.scaled_dot_product_attention) saved as a user ships it
(torch.export.save, a dynamic batch), its data, and PyTorch eager's reference values on the
device: each parameter's fp32 gradient of one step (TF32 off), and the per-step losses of a
full-batch bf16-autocast run with fused AdamW as kiln trains (learning rate 0.003, weight decay
0.01 on parameters of rank 2 and up, none on the rest, constant schedule).

    compiled_train.py OUT DEVICE STEPS    writes OUT/model.pt2 and OUT/reference.json (and on
                                          CUDA OUT/model_fixed.pt2, its batch fixed)

JSON, not .npy: the Python that runs this need not have numpy.
"""

import copy
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

SEQ, FEATURES, CLASSES, SAMPLES, GRAD_BATCH = 32, 16, 4, 256, 64


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, h):
        b, s, d = h.shape
        q, k, v = self.qkv(self.norm1(h)).split(d, -1)
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(q), split(k), split(v))
        h = h + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return h + self.ff(self.norm2(h))


class Classifier(nn.Module):
    def __init__(self, d=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Linear(FEATURES, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, CLASSES)

    def forward(self, x):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h).mean(1))


def flat(t):
    t = t.detach().float().cpu()
    return {"shape": list(t.shape), "values": t.flatten().tolist()}


def gradients(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    return {n: flat(p.grad) for n, p in model.named_parameters()}


def bf16_losses(model, x, y, steps, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=3e-3, fused=True)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main(out, device, steps):
    device = torch.device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, SEQ, FEATURES, generator=g)
    y = x[:, :, :CLASSES].mean(1).argmax(1)
    model = Classifier().train()
    program = torch.export.export(model, (x[:8],), dynamic_shapes=({0: Dim("batch")},))
    torch.export.save(program, f"{out}/model.pt2")
    if device.type == "cuda":
        # The same program with its batch fixed (the whole data set): whether a miscompile of
        # the dynamic one is about its symbolic batch.
        torch.export.save(torch.export.export(model, (x,)), f"{out}/model_fixed.pt2")
    on_device = copy.deepcopy(model).to(device)
    xd, yd = x.to(device), y.to(device)
    ref = {
        "x": flat(x), "y": flat(y), "grad_batch": GRAD_BATCH,
        "gradients": gradients(on_device, xd[:GRAD_BATCH], yd[:GRAD_BATCH]),
        "losses": bf16_losses(on_device, xd, yd, steps, device),
        "params": sum(p.numel() for p in model.parameters()),
        "torch": torch.__version__,
    }
    with open(f"{out}/reference.json", "w") as f:
        json.dump(ref, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
