"""Programs as a user ships them now (torch.export.save) for kiln's exported-program tests
(crates/cli/tests/program.rs), their data, and PyTorch eager's reference values.

    programs.py make OUT     .pt2 programs, data (JSON) and reference.json in OUT
    programs.py run X.json OUT.json PROGRAM WEIGHTS [PROGRAM WEIGHTS ...]
                             each program's outputs on the inputs, as a JSON list: with the
                             weights of a kiln checkpoint (model.safetensors) put in by name,
                             or its own for WEIGHTS "-" (for a program that takes the target,
                             its "prediction" with a target of zeros)

JSON, not .npy: the provisioned venv has no numpy. Python floats print float32 values exactly.
"""

import json
import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim


class Mlp(nn.Module):
    """A classifier: 10 features, 3 classes, with an optional dropout."""

    def __init__(self, p=0.0):
        super().__init__()
        self.fc1 = nn.Linear(10, 32)
        self.norm = nn.LayerNorm(32)
        self.drop = nn.Dropout(p)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(self.drop(F.gelu(self.norm(self.fc1(x)))))


class Attention(nn.Module):
    """A pre-norm attention block over [B, 8, 6] sequences with
    F.scaled_dot_product_attention, then a classifier of 3 classes."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.embed = nn.Linear(6, d)
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.head = nn.Linear(d, 3)

    def forward(self, x):
        h = self.embed(x)
        b, s, d = h.shape
        q, k, v = self.qkv(self.norm(h)).split(d, -1)
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(q), split(k), split(v))
        h = h + self.out(a.transpose(1, 2).reshape(b, s, d))
        return self.head(h.mean(1))


class ConvBn(nn.Module):
    """[B, 2, 6, 6] images to 3 classes through conv (no bias), batch norm, ReLU, pooling."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc(F.relu(self.bn(self.conv(x))).mean((2, 3)))


class DictNet(nn.Module):
    """Everything kiln must say something about, in one program (one compile): what
    torch.jit.script rejects (keyword arguments, a dict of mixed outputs), a deep-supervision
    head the loss never reaches (`aux`, which must be frozen), and a dropout; saved in eval
    mode with a fixed batch of 16."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 16)
        self.drop = nn.Dropout(0.0)
        self.fc2 = nn.Linear(16, 3)
        self.aux = nn.Linear(10, 3)

    def forward(self, x, **options):
        h = self.drop(torch.tanh(self.fc1(x)))
        return {"logits": self.fc2(h), "features": h, "aux": (self.aux(x), h.mean())}


class Quantiles(nn.Module):
    """A forecaster's head with a loss of its own, which kiln does not have: the 0.1, 0.5 and
    0.9 quantiles of a value, trained by the pinball loss. It takes the target and returns
    the loss and the prediction (train.loss = module, model.output = prediction)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 16)
        self.fc2 = nn.Linear(16, 3)
        self.register_buffer("q", torch.tensor([0.1, 0.5, 0.9]))

    def forward(self, x, target):
        pred = self.fc2(torch.tanh(self.fc1(x)))
        err = target.unsqueeze(-1) - pred
        return {"loss": torch.maximum(self.q * err, (self.q - 1) * err).mean(),
                "prediction": pred}


def flat(t):
    return {"shape": list(t.shape), "values": t.flatten().tolist()}


def export(model, x, path, dynamic=True, train=True):
    model.train(train)
    shapes = ({0: Dim("batch")},) if dynamic else None
    torch.export.save(torch.export.export(model, (x,), dynamic_shapes=shapes), path)


def gradients(model, x, y):
    """Each parameter's gradient of the mean cross-entropy on (x, y), and the buffers after
    that one train-mode forward (batch-norm statistics)."""
    model.train()
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    grads = {n: flat(p.grad) for n, p in model.named_parameters()}
    buffers = {n: flat(b.float()) for n, b in model.named_buffers()}
    return grads, buffers


def cross_entropy(model, x, y):
    return F.cross_entropy(model(x).float(), y)


def own_loss(model, x, y):
    return model(x, y)["loss"]


def eager_losses(model, x, y, steps, lr=1e-2, amp=None, loss_of=cross_entropy):
    """Full-batch training as kiln runs it: fused AdamW, weight decay 0.01 on parameters of
    rank 2 and up, none on the rest; the loss of each step before its update."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=lr, fused=True)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=amp or torch.float32, enabled=amp is not None):
            loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def classify_data(n, generator):
    x = torch.randn(n, 10, generator=generator)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return x, y


def make(out):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ref = {}

    x, y = classify_data(64, g)
    mlp = Mlp()
    export(mlp, x, f"{out}/mlp.pt2")
    ref["mlp"] = {"x": flat(x), "y": flat(y)}
    ref["mlp"]["gradients"], _ = gradients(mlp, x, y)
    ref["mlp"]["losses"] = eager_losses(mlp, x, y, 20)

    xs = torch.randn(32, 8, 6, generator=g)
    ys = (xs[:, :, 0].mean(1) > 0).long() + (xs[:, 0, 1] > 0.5).long()
    attn = Attention()
    export(attn, xs, f"{out}/attention.pt2")
    ref["attention"] = {"x": flat(xs), "y": flat(ys)}
    ref["attention"]["gradients"], _ = gradients(attn, xs, ys)

    xi = torch.randn(24, 2, 6, 6, generator=g)
    yi = (xi[:, 0].mean((1, 2)) > 0).long() + (xi[:, 1, 0, 0] > 0.5).long()
    conv = ConvBn()
    export(conv, xi, f"{out}/convbn.pt2")
    ref["convbn"] = {"x": flat(xi), "y": flat(yi)}
    ref["convbn"]["gradients"], ref["convbn"]["buffers"] = gradients(conv, xi, yi)

    # bf16 autocast: PyTorch eager's learning on the same module from the same weights.
    bf16 = Mlp()
    xb, yb = classify_data(256, g)
    export(bf16, xb, f"{out}/mlp_bf16.pt2")
    ref["bf16"] = {"x": flat(xb), "y": flat(yb),
                   "losses": eager_losses(bf16, xb, yb, 40, amp=torch.bfloat16)}
    xh, yh = classify_data(512, g)
    with torch.no_grad():
        accuracy = (bf16(xh).argmax(1) == yh).float().mean().item()
    ref["bf16"]["held_out"] = {"x": flat(xh), "y": flat(yh), "accuracy": accuracy}

    # A loss of the program's own: it takes the target (dynamic batch on both inputs).
    xq = torch.randn(64, 10, generator=g)
    yq = xq[:, 0] + 0.5 * xq[:, 1] * torch.randn(64, generator=g)
    quantiles = Quantiles().train()
    batch = Dim("batch")
    program = torch.export.export(quantiles, (xq, yq), dynamic_shapes=({0: batch}, {0: batch}))
    torch.export.save(program, f"{out}/quantiles.pt2")
    ref["quantiles"] = {"x": flat(xq), "y": flat(yq),
                        "losses": eager_losses(quantiles, xq, yq, 20, loss_of=own_loss)}

    export(Mlp(p=0.2), x, f"{out}/dropout.pt2")
    export(DictNet(), x[:16], f"{out}/dict.pt2", dynamic=False, train=False)
    try:
        torch.jit.script(DictNet())
        ref["dict_scripts"] = True
    except Exception:  # noqa: BLE001 - TorchScript rejects it, which is the point
        ref["dict_scripts"] = False
    export(nn.Linear(11, 3), torch.randn(4, 11), f"{out}/eleven.pt2")
    torch.jit.script(Mlp().train()).save(f"{out}/scripted.pt2")

    with open(f"{out}/reference.json", "w") as f:
        json.dump(ref, f)


def read_safetensors(path):
    """A safetensors file's tensors (read here: the venv's safetensors.torch needs packaging)."""
    import struct
    dtypes = {"F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16,
              "F16": torch.float16}
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        t = torch.frombuffer(bytearray(body[start:end]), dtype=dtypes[meta["dtype"]])
        out[name] = t.reshape(meta["shape"])
    return out


def output(program, weights, x):
    """What `program` (its own weights, or those of the safetensors file `weights` when it is
    not "-") computes on `x` in its exported mode; an own-loss program's prediction."""
    ep = torch.export.load(program)
    module = ep.module()
    state = read_safetensors(weights) if weights != "-" else None
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if state is not None:
                t.copy_(state[name])
        takes_target = len(ep.graph_signature.user_inputs) == 2
        y = module(x, torch.zeros(x.shape[0]))["prediction"] if takes_target else module(x)
    return flat(y)


def run(inputs, out, pairs):
    """The outputs of each (program, weights) of `pairs` on the inputs in the JSON file
    `inputs`, as a JSON list in `out` (one Python for them all)."""
    with open(inputs) as f:
        x = json.load(f)
    x = torch.tensor(x["values"], dtype=torch.float32).reshape(x["shape"])
    outputs = [output(program, weights, x) for program, weights in pairs]
    with open(out, "w") as f:
        json.dump(outputs, f)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        rest = sys.argv[4:]
        run(sys.argv[2], sys.argv[3], list(zip(rest[::2], rest[1::2])))
