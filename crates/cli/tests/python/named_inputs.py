"""TorchScript models that take several named inputs, for kiln's named-array training tests
(crates/cli/tests/named_inputs.rs), the same module exported as a program taking its
arguments by name, their data, and PyTorch eager's reference losses.

    named_inputs.py make OUT     scripted models, data (JSON) and reference losses in OUT

A sample is three arrays of different types: `x` (f32 [4]), `cat` (int64 category), `mask`
(bool [4]); its target `y` is one of 2 classes. JSON, not .npy: the provisioned venv has no
numpy. Python floats print float32 values exactly.
"""

import json
import sys
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch.export import Dim


class DictModel(torch.nn.Module):
    """Takes every array by name, as one Dict[str, Tensor]."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 16)
        self.emb = torch.nn.Embedding(5, 16)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        x = inputs["x"] * inputs["mask"].to(torch.float32)
        return self.out(torch.relu(self.fc(x) + self.emb(inputs["cat"])))


class ArgsModel(torch.nn.Module):
    """Takes one tensor per argument: `x`, then `cat`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 16)
        self.emb = torch.nn.Embedding(5, 16)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor, cat: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc(x) + self.emb(cat)))


class MaskedModel(torch.nn.Module):
    """Takes `x` and an optional `mask`: kiln passes the mask while the dataset has one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 16)
        self.out = torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        if mask is not None:
            x = x * mask.to(torch.float32)
        return self.out(torch.relu(self.fc(x)))


class OneTensor(torch.nn.Module):
    """Takes one tensor, `features`: no array of the dataset has that name."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)


def flat(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "values": t.flatten().tolist()}


def eager_losses(step, params, steps: int) -> list:
    """Full-batch training as kiln runs it: fused AdamW, lr 1e-2, weight decay 0.01 on
    parameters of rank 2 and up, none on the rest; the loss of each step before its update."""
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2,
        fused=True,
    )
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = step()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def make(out: str) -> None:
    torch.manual_seed(0)
    n = 64
    x = torch.randn(n, 4)
    cat = torch.randint(0, 5, (n,))
    mask = torch.rand(n, 4) > 0.25
    y = ((x * mask).sum(1) + (cat % 2) * 1.5 > 0.75).long()
    data = {"x": flat(x), "cat": flat(cat), "mask": flat(mask.long()), "y": flat(y)}

    by_dict = DictModel()
    torch.jit.script(by_dict.train()).save(f"{out}/dict.pt")
    inputs = {"x": x, "cat": cat, "mask": mask}
    dict_losses = eager_losses(
        lambda: F.cross_entropy(by_dict(inputs), y), list(by_dict.parameters()), 20
    )

    by_args = ArgsModel()
    torch.jit.script(by_args.train()).save(f"{out}/args.pt")
    # The same module and weights exported as a program taking (x, cat) by argument name, and
    # one whose second argument is named after no array.
    batch = Dim("batch")
    shapes = ({0: batch}, {0: batch})
    torch.export.save(torch.export.export(by_args, (x, cat), dynamic_shapes=shapes),
                      f"{out}/args.pt2")

    class Renamed(ArgsModel):
        def forward(self, x: torch.Tensor, category: torch.Tensor) -> torch.Tensor:
            return super().forward(x, category)

    torch.export.save(torch.export.export(Renamed(), (x, cat), dynamic_shapes=shapes),
                      f"{out}/renamed.pt2")
    args_losses = eager_losses(
        lambda: F.cross_entropy(by_args(x, cat), y), list(by_args.parameters()), 20
    )

    masked = MaskedModel()
    torch.jit.script(masked.train()).save(f"{out}/masked.pt")
    masked_losses = eager_losses(
        lambda: F.cross_entropy(masked(x, mask), y), list(masked.parameters()), 20
    )

    torch.jit.script(OneTensor().train()).save(f"{out}/one.pt")

    with open(f"{out}/reference.json", "w") as f:
        json.dump({"data": data, "dict": dict_losses, "args": args_losses,
                   "masked": masked_losses}, f)


if __name__ == "__main__":
    make(sys.argv[2])
