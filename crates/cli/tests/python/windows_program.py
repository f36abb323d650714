"""A small TFT-style forecaster exported with torch.export, taking a window's named arrays as one
dict and the target, and computing its own quantile (pinball) loss, for the test that kiln
trains the program on a windowed dataset as PyTorch eager trains the module
(crates/cli/tests/windows.rs).

    windows_program.py make OUT    reads OUT/windows.json (kiln's training windows, every
                                   array by name, and the targets); writes OUT/forecaster.pt2,
                                   OUT/mismatched.pt2 and OUT/reference.json (eager's per-step
                                   losses over 50 full-batch steps)

The model: the static category embedded; a variable selection over the encoder's reals (a
softmax weight per variable and step); an LSTM encoder and an LSTM decoder over the known reals
(cells unrolled over the steps); the decoder attending over the encoder's states; a head of 3
quantiles per horizon step in scaled units, turned back into the original units with
`target_scale`; the pinball loss over them. No dropout, so every step is deterministic.
"""

import json
import sys
from typing import Dict

import torch
from torch import nn
from torch.export import Dim
from named_inputs import eager_losses  # beside this script
from windows_model import tensor

QUANTILES = (0.1, 0.5, 0.9)


class Cell(nn.Module):
    """One LSTM cell."""

    def __init__(self, inputs, hidden):
        super().__init__()
        self.gates = nn.Linear(inputs + hidden, 4 * hidden)

    def forward(self, x, h, c):
        i, f, g, o = self.gates(torch.cat([x, h], -1)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c


class Forecaster(nn.Module):
    def __init__(self, reals, known, categories, hidden=16):
        super().__init__()
        self.static = nn.Embedding(categories, hidden)
        self.select = nn.Linear(reals + hidden, reals)
        self.project = nn.Linear(reals, hidden)
        self.encoder = Cell(hidden, hidden)
        self.decoder = Cell(known, hidden)
        self.attend = nn.MultiheadAttention(hidden, 2, batch_first=True)
        self.head = nn.Linear(2 * hidden, len(QUANTILES))
        self.register_buffer("quantiles", torch.tensor(QUANTILES))

    def forward(self, inputs: Dict[str, torch.Tensor], target: torch.Tensor):
        enc, dec = inputs["encoder_cont"], inputs["decoder_cont"]
        static = self.static(inputs["static_cat"][:, 0])
        context = static.unsqueeze(1).expand(-1, enc.shape[1], -1)
        weights = torch.softmax(self.select(torch.cat([enc, context], -1)), -1)
        x = self.project(enc * weights)
        h, c = static, torch.zeros_like(static)
        states = []
        for t in range(x.shape[1]):
            h, c = self.encoder(x[:, t], h, c)
            states.append(h)
        memory = torch.stack(states, 1)
        outs = []
        for t in range(dec.shape[1]):
            h, c = self.decoder(dec[:, t], h, c)
            outs.append(h)
        query = torch.stack(outs, 1)
        attended, _ = self.attend(query, memory, memory, need_weights=False)
        scaled = self.head(torch.cat([query, attended], -1))
        scale = inputs["target_scale"]
        pred = scaled * scale[:, 1, None, None] + scale[:, 0, None, None]
        error = target.unsqueeze(-1) - pred
        loss = torch.maximum(self.quantiles * error, (self.quantiles - 1) * error).mean()
        return loss, pred


NAMES = {"encoder_cont": torch.float32, "decoder_cont": torch.float32,
         "static_cat": torch.int64, "target_scale": torch.float32}


def export(model, inputs, y, path):
    batch = Dim("batch")
    shapes = ({k: {0: batch} for k in inputs}, {0: batch})
    ep = torch.export.export(model.train(), (inputs, y), dynamic_shapes=shapes)
    torch.export.save(ep, path)


def make(out: str) -> None:
    with open(f"{out}/windows.json") as f:
        data = json.load(f)
    inputs = {name: tensor(data[name], dtype) for name, dtype in NAMES.items()}
    y = tensor(data["target"], torch.float32)
    torch.manual_seed(0)
    model = Forecaster(inputs["encoder_cont"].shape[-1], inputs["decoder_cont"].shape[-1], 2)
    export(model, inputs, y, f"{out}/forecaster.pt2")
    # The same model taking `static_cat` as float32: a dtype the dataset's array does not have.
    wrong = dict(inputs, static_cat=inputs["static_cat"].float())

    class Floats(Forecaster):
        def forward(self, inputs: Dict[str, torch.Tensor], target: torch.Tensor):
            return super().forward(dict(inputs, static_cat=inputs["static_cat"].long()), target)

    export(Floats(3, 1, 2), wrong, y, f"{out}/mismatched.pt2")
    losses = eager_losses(lambda: model(inputs, y)[0], list(model.parameters()), 50)
    with open(f"{out}/reference.json", "w") as f:
        json.dump({"losses": losses}, f)


if __name__ == "__main__":
    make(sys.argv[2])
