"""Exports a small PyTorch model as TorchScript, scripted and traced, with inputs and PyTorch's
own outputs, for kiln's bring-your-own-model test (crates/cli/tests/infer.rs).

The scripted module is saved in training mode, with dropout, so that only a model kiln puts in
eval mode reproduces PyTorch's eval outputs. A small convolutional net (conv.pt) is there for
channels-last.
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


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.conv1(x)))


def conv(out: str) -> dict:
    """A convolutional module of one input channel (its weights are what channels-last
    re-lays), scripted, with inputs and outputs."""
    net = ConvNet().eval()
    x = torch.randn(6, 1, 10, 10)
    with torch.no_grad():
        y = net(x)
    torch.jit.script(net).save(f"{out}/conv.pt")
    return {"conv_x_shape": list(x.shape), "conv_x": x.flatten().tolist(),
            "conv_y_shape": list(y.shape), "conv_y": y.flatten().tolist()}


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
                **conv(out),
            },
            f,
        )


if __name__ == "__main__":
    main(sys.argv[1])
