"""Exports a small PyTorch model as TorchScript, scripted and traced, with inputs and PyTorch's
own outputs, for kiln's bring-your-own-model test (crates/cli/tests/infer.rs).

The scripted module is saved in training mode, with dropout, so that only a model kiln puts in
eval mode reproduces PyTorch's eval outputs.
"""

import json
import sys

import torch


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(20, 48)
        self.norm = torch.nn.LayerNorm(48)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(48, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.norm(torch.nn.functional.gelu(self.fc1(x)))))


def main(out: str) -> None:
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(50, 20)
    net.eval()
    with torch.no_grad():
        y = net(x)
    torch.jit.trace(net, x[:4]).save(f"{out}/traced.pt")
    net.train()
    torch.jit.script(net).save(f"{out}/scripted.pt")
    # JSON, not .npy or safetensors: the provisioned venv has no numpy. Python floats print
    # float32 values exactly.
    with open(f"{out}/reference.json", "w") as f:
        json.dump(
            {
                "x_shape": list(x.shape),
                "x": x.flatten().tolist(),
                "y_shape": list(y.shape),
                "y": y.flatten().tolist(),
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1])
