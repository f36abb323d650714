"""Makes the tiny ONNX/TorchScript twin fixtures for kiln's ONNX serving tests (no Python at
test time): an MLP 4 -> 8 -> 3 (seed 0) as TorchScript (`tiny_mlp.pt`, traced) and ONNX
(`tiny_mlp.onnx`, legacy exporter, opset 17, dynamic batch), a fixed-batch variant
(`tiny_mlp_batch2.onnx`, batch fixed at 2) and the expected outputs for a fixed input
(`tiny_mlp_io.json`). Run with torch 2.11 and onnx==1.21.0 on PYTHONPATH:
    PYTHONPATH=<onnx packages> python make_fixture.py
"""
import json
import warnings

import torch
from torch import nn

warnings.filterwarnings("ignore")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
example = torch.zeros(2, 4)
with torch.no_grad():
    traced = torch.jit.trace(model, example)
traced.save("tiny_mlp.pt")
common = dict(dynamo=False, opset_version=17, input_names=["input"], output_names=["output"])
torch.onnx.export(traced, (example,), "tiny_mlp.onnx",
                  dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}}, **common)
torch.onnx.export(traced, (example,), "tiny_mlp_batch2.onnx", **common)
x = torch.tensor([[0.1, -0.2, 0.3, -0.4], [1.0, 2.0, -3.0, 0.5], [0.0, 0.0, 0.0, 0.0]])
with torch.no_grad():
    y = model(x)
json.dump({"inputs": x.tolist(), "outputs": y.tolist()}, open("tiny_mlp_io.json", "w"), indent=1)
print("wrote tiny_mlp.pt, tiny_mlp.onnx, tiny_mlp_batch2.onnx, tiny_mlp_io.json")
