"""A small forecaster taking a window's named arrays as one Dict[str, Tensor], for the test that
kiln trains it on a windowed dataset as PyTorch eager does (crates/cli/tests/windows.rs).

    windows_model.py make OUT    reads OUT/windows.json (kiln's training windows, every array
                                 by name, and the targets), writes OUT/forecaster.pt and
                                 OUT/reference.json (eager's per-step losses)

The model: an LSTM over `encoder_cont`, its last state and each step's `decoder_cont` through a
linear head to a prediction per horizon step in scaled units, turned back into the original units
with `target_scale` (as pytorch-forecasting's models do), so its MSE loss is in those units.
"""

import json
import sys
from typing import Dict

import torch
import torch.nn.functional as F
from named_inputs import eager_losses  # beside this script


class Forecaster(torch.nn.Module):
    def __init__(self, reals: int, known: int) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(reals, 16, batch_first=True)
        self.head = torch.nn.Linear(16 + known, 1)

    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        _, (h, _) = self.lstm(inputs["encoder_cont"])
        dec = inputs["decoder_cont"]
        state = h[-1].unsqueeze(1).expand(-1, dec.shape[1], -1)
        scaled = self.head(torch.cat([state, dec], dim=-1)).squeeze(-1)
        scale = inputs["target_scale"]
        return scaled * scale[:, 1:2] + scale[:, 0:1]


def tensor(t: dict, dtype) -> torch.Tensor:
    return torch.tensor(t["values"], dtype=dtype).reshape(t["shape"])


def make(out: str) -> None:
    with open(f"{out}/windows.json") as f:
        data = json.load(f)
    inputs = {
        name: tensor(data[name], torch.float32)
        for name in ("encoder_cont", "decoder_cont", "target_scale")
    }
    y = tensor(data["target"], torch.float32)
    torch.manual_seed(0)
    model = Forecaster(inputs["encoder_cont"].shape[-1], inputs["decoder_cont"].shape[-1])
    torch.jit.script(model.train()).save(f"{out}/forecaster.pt")
    losses = eager_losses(lambda: F.mse_loss(model(inputs), y), list(model.parameters()), 20)
    with open(f"{out}/reference.json", "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    make(sys.argv[2])
