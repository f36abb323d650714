"""kiln export's ONNX step: a TorchScript file (written by kiln) to ONNX with a dynamic batch
dimension, through PyTorch's TorchScript-based exporter (the dynamo exporter cannot take a
ScriptModule), with kiln's provenance in the model's metadata, checked by onnx.checker.

Embedded in kiln (include_str!) and run with the provisioned torch's Python, with the pinned
packages of onnx-requirements.txt on PYTHONPATH. Prints one JSON line on success; on failure
the last line of stderr says why.
"""
import argparse
import json
import sys
import time
import warnings


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sample-shape", required=True)
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--meta", action="append", default=[])
    a = p.parse_args()
    try:
        import onnx
    except ImportError as e:
        sys.exit(f"kiln-export: the onnx package is missing ({e})")
    import torch

    torch.set_num_threads(1)
    shape = [int(d) for d in a.sample_shape.split(",")]
    started = time.time()
    module = torch.jit.load(a.script, map_location="cpu").eval()
    example = torch.zeros(2, *shape)
    with warnings.catch_warnings():
        # The one expected warning: this exporter is the legacy one (see the module docstring).
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.onnx.export(
            module,
            (example,),
            a.out,
            dynamo=False,
            opset_version=a.opset,
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
        )
    model = onnx.load(a.out)
    for kv in a.meta:
        key, value = kv.split("=", 1)
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, a.out)
    print(json.dumps({
        "seconds": round(time.time() - started, 2),
        "opset": model.opset_import[0].version,
        "ir_version": model.ir_version,
        "nodes": len(model.graph.node),
        "onnx": onnx.__version__,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as e:  # the message is what kiln reports
        print(f"kiln-export: {type(e).__name__}: {e}".replace("\n", " "), file=sys.stderr)
        sys.exit(1)
