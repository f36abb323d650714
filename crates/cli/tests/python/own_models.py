"""The user's own PyTorch models for kiln's bring-your-own-model training tests
(crates/cli/tests/own_model.rs), their data, and PyTorch's reference runs.

    own_models.py make OUT       scripted models, data (JSON) and reference losses in OUT
    own_models.py run MODEL X.json OUT.json
                                 the eval-mode outputs of a TorchScript file on inputs

JSON, not .npy: the provisioned venv has no numpy. Python floats print float32 values exactly.
"""

import json
import sys

import torch
import torch.nn.functional as F


class Mlp(torch.nn.Module):
    """A classifier: 10 features, 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(10, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


class Segmenter(torch.nn.Module):
    """A class per pixel: [B, 1, 8, 8] images to [B, 2, 8, 8] logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.bn(self.conv1(x))))


class Forecaster(torch.nn.Module):
    """A horizon of 3 values from 6, with its own pinball (quantile) loss at q = 0.9."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))

    @torch.jit.export
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        error = target - output
        return torch.maximum(0.9 * error, (0.9 - 1.0) * error).mean()


def flat(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "values": t.flatten().tolist()}


def eager_losses(model: torch.nn.Module, x, y, steps: int, loss_fn) -> list:
    """Full-batch training as kiln runs it: fused AdamW, lr 1e-2, weight decay 0.01 on
    parameters of rank 2 and up, none on the rest; the loss of each step before its update."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2,
        fused=True,
    )
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def make(out: str) -> None:
    torch.manual_seed(0)
    reference = {}

    mlp = Mlp()
    x = torch.randn(64, 10)
    y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    torch.jit.script(mlp.train()).save(f"{out}/mlp.pt")
    torch.jit.script(mlp.eval()).save(f"{out}/mlp_eval.pt")
    mlp.train()
    reference["classify"] = {"x": flat(x), "y": flat(y)}
    reference["classify"]["losses"] = eager_losses(mlp, x, y, 20, F.cross_entropy)

    seg = Segmenter()
    images = torch.randn(96, 1, 8, 8)
    masks = (F.avg_pool2d(images, 3, stride=1, padding=1) > 0).long().squeeze(1)
    torch.jit.script(seg.train()).save(f"{out}/seg.pt")
    reference["segment"] = {"x": flat(images), "y": flat(masks)}

    forecaster = Forecaster()
    past = torch.randn(128, 6)
    future = torch.stack([past[:, :2].sum(1), past[:, 2] - past[:, 3], past[:, 4]], 1)
    future = future + 0.05 * torch.randn(128, 3)
    scripted = torch.jit.script(forecaster.train())
    scripted.save(f"{out}/forecaster.pt")
    reference["forecast"] = {"x": flat(past), "y": flat(future)}
    with torch.no_grad():
        reference["forecast"]["initial_loss"] = forecaster.loss(forecaster(past), future).item()

    with open(f"{out}/reference.json", "w") as f:
        json.dump(reference, f)


def run(model: str, inputs: str, out: str) -> None:
    module = torch.jit.load(model)
    module.eval()
    with open(inputs) as f:
        x = json.load(f)
    x = torch.tensor(x["values"], dtype=torch.float32).reshape(x["shape"])
    with torch.no_grad():
        y = module(x)
    with open(out, "w") as f:
        json.dump(flat(y), f)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        run(sys.argv[2], sys.argv[3], sys.argv[4])
