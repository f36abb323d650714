"""kiln export --quantize int8: dynamic int8 quantization of an ONNX model's Linear and MatMul
weights by ONNX Runtime's own tool (onnxruntime.quantization.quantize_dynamic). ONNX Runtime
quantizes MatMul dynamically but not Gemm, which PyTorch's exporter writes for a Linear layer on
2-D inputs; such a Gemm (constant weight, no transposed input, alpha = beta = 1) is first
rewritten as the MatMul and Add it computes. kiln runs this in the provisioned Python with the
export packages and the onnxruntime wheel on PYTHONPATH, then checks the result on the user's
data before publishing it. Prints one JSON line."""

import argparse
import json
import os
import sys


def attribute(node, name, default):
    for a in node.attribute:
        if a.name == name:
            return a.f if a.type == a.FLOAT else a.i
    return default


def constants_as_initializers(model):
    """Moves Constant nodes' tensors (how the TorchScript exporter stores weights) into the
    graph's initializers, where the quantizer looks for constant weights; returns how many."""
    nodes, moved = [], 0
    for node in model.graph.node:
        value = [a for a in node.attribute if a.name == "value" and a.type == a.TENSOR]
        if node.op_type != "Constant" or not value:
            nodes.append(node)
            continue
        tensor = value[0].t
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
        moved += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return moved


def gemms_as_matmuls(model, onnx, numpy_helper):
    """Rewrites each plain Gemm with a constant weight as MatMul (+ Add); returns how many."""
    weights = {t.name: t for t in model.graph.initializer}
    nodes, rewritten = [], 0
    for node in model.graph.node:
        plain = (
            node.op_type == "Gemm"
            and node.input[1] in weights
            and attribute(node, "transA", 0) == 0
            and attribute(node, "alpha", 1.0) == 1.0
            and attribute(node, "beta", 1.0) == 1.0
        )
        if not plain:
            nodes.append(node)
            continue
        w = numpy_helper.to_array(weights[node.input[1]])
        if attribute(node, "transB", 0):
            w = w.T.copy()
        name = node.input[1] + "_as_matmul"
        model.graph.initializer.append(numpy_helper.from_array(w, name))
        has_bias = len(node.input) > 2 and node.input[2] != ""
        product = node.output[0] + "_matmul" if has_bias else node.output[0]
        nodes.append(onnx.helper.make_node("MatMul", [node.input[0], name], [product]))
        if has_bias:
            nodes.append(onnx.helper.make_node("Add", [product, node.input[2]], [node.output[0]]))
        rewritten += 1
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return rewritten


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, help="the fp32 ONNX file")
    p.add_argument("--out", required=True, help="where the int8 file goes")
    a = p.parse_args()
    try:
        import onnx
        from onnx import numpy_helper
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        sys.exit(f"onnxruntime's quantization tools cannot be imported: {e}")
    model = onnx.load(a.model)
    constants_as_initializers(model)
    rewritten = gemms_as_matmuls(model, onnx, numpy_helper)
    plain = a.out + ".matmul.onnx"
    onnx.save(model, plain)
    try:
        quantize_dynamic(plain, a.out, weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    finally:
        os.remove(plain)
    nodes = onnx.load(a.out).graph.node
    integer = sum(1 for n in nodes if n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul"))
    if integer == 0:
        os.remove(a.out)
        sys.exit(
            "nothing to quantize: the model has no Linear or MatMul layer with constant weights "
            "(dynamic int8 quantizes those; convolutions stay fp32)"
        )
    print(json.dumps({"gemms_rewritten": rewritten, "integer_matmuls": integer}))


main()
