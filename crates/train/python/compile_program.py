"""kiln's compiler for a user's torch.export'ed program (a .pt2 ExportedProgram).

Builds, for one run's loss and precision on one device, two AOTInductor packages whose
parameters and buffers are inputs (so kiln passes its own tensors each step):

  train.pt2  inputs: parameters, buffers, the inputs (one features tensor, or the dataset's
             named arrays in the program's order), target, loss scale (a 0-dim float32)
             outputs: the new value of each mutated buffer (batch-norm statistics), the
             scaled loss, the loss, the model's output (detached), then one gradient per
             parameter (of the scaled loss)
  eval.pt2   inputs: parameters, buffers, the inputs; output: the model's output, the program
             switched to eval mode (dropout off, batch norm on its running statistics)

The train step is the joint forward+backward graph of the program wrapped with the loss
(torch._functorch.aot_autograd.aot_export_module, trace_joint=True), traced with a symbolic
batch dimension where the program has one, exported again and compiled by AOTInductor. Random
ops fall back to eager kernels (torch._inductor.config.fallback_random), so dropout draws what
eager PyTorch draws from the same generator state.

`compile_program.py export ...` writes a trained program instead (kiln export): the program
with a checkpoint's weights put in by name, in eval mode (dropout off, batch norm on its running
statistics; re-exported with its dynamic batch) or as it was exported, as a .pt2 read back and
compared tensor by tensor, or in eval mode as ONNX (PyTorch's exporter for exported programs).

Prints one JSON line on stdout: the manifest, or {"error": {"kind": ..., "message": ...}} with
exit status 2 for a problem with the user's program or settings. Progress goes to stderr.
"""

import argparse
import contextlib
import ctypes
import hashlib
import json
import math
import os
import struct
import subprocess
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

LOSSES = ("cross_entropy", "mse", "l1", "huber", "bce_with_logits", "module")
DTYPES = {"float32": torch.float32, "int64": torch.int64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "bool": torch.bool}
AMP = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class UserError(Exception):
    """A problem with the program or the settings, reported as {"error": ...}."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def log(*args):
    print("compile_program:", *args, file=sys.stderr, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--program", required=True, help="the ExportedProgram (.pt2)")
    p.add_argument("--out", required=True, help="directory for train.pt2, eval.pt2")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--loss", choices=LOSSES, default=None, help="needed for the train step")
    p.add_argument("--precision", choices=tuple(AMP), default="fp32")
    p.add_argument("--sample-shape", required=True, help="one sample's shape, e.g. 64 or 3,32,32")
    p.add_argument("--feature-dtype", choices=tuple(DTYPES), default="float32")
    p.add_argument("--inputs", default=None, help="JSON: the dataset's arrays by name, "
                   "{name: {\"dtype\": …, \"shape\": […]}}, matched to the program's inputs by "
                   "name (instead of one features tensor of --sample-shape)")
    p.add_argument("--target-shape", default="", help="one target's shape ('' for a scalar)")
    p.add_argument("--target-dtype", choices=tuple(DTYPES), default="int64")
    p.add_argument("--classes", type=int, default=None)
    p.add_argument("--output", default=None, help="the output the loss uses (dict key or index)")
    p.add_argument("--freeze", default="", help="parameters kept at their values (names or "
                   "prefixes, comma separated): no gradient, not trained")
    p.add_argument("--what", choices=("train", "eval", "both"), default="both")
    p.add_argument("--attention", choices=("auto", "fused", "math"), default="auto",
                   help="the attention kernel the packages use: PyTorch's fused kernel, the "
                   "explicit product (two batched GEMMs and a softmax), or on the CPU whichever "
                   "is measured faster at the program's attention shapes (see choose_attention)")
    p.add_argument("--batch-hint", type=int, default=None, help="the batch to trace a dynamic "
                   "program with (default 3): Inductor bounds the packages' batch sizes around "
                   "it where it picks kernels by it")
    p.add_argument("--log", default=None, help="where an Inductor failure's traceback goes "
                   "(default: OUT/compile.log)")
    return p.parse_args(argv)


def shape_of(text):
    return [int(d) for d in text.split(",") if d.strip()]


# --- the program -------------------------------------------------------------------------


def load_program(path):
    try:
        return torch.export.load(path)
    except Exception as e:  # noqa: BLE001 - any failure to load means "not a program"
        raise UserError("not_a_program", f"torch.export.load cannot read it: {first_line(e)}")


def first_line(e):
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0] if text else type(e).__name__


def user_inputs(ep):
    """The program's tensor inputs, in the order it takes them (its pytree's leaves): each
    one's name (a dict argument's key, or the argument's own name) and example (its shape, with
    symbols, and dtype)."""
    from torch.export.graph_signature import InputKind

    user = [s for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    names = leaf_names(ep)
    if len(names) != len(user):
        names = [s.arg.name for s in user]
    out = []
    for name, spec in zip(names, user):
        node = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name)
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise UserError("inputs", f"the program's input {name} is not a tensor")
        out.append((name, val))
    return out


def leaf_names(ep):
    """The name of each leaf of the program's positional arguments: a dict argument's keys, a
    tensor argument's name."""
    spec = ep.call_spec.in_spec
    arg_names = ep.module_call_graph[0].signature.forward_arg_names or []
    names = []
    for i, arg in enumerate(spec.child(0).children()):
        if arg.is_leaf():
            names.append(arg_names[i] if i < len(arg_names) else f"arg{i}")
        elif arg.type is dict:
            names += [str(k) for k in arg.context]
        else:
            names += [f"{arg_names[i] if i < len(arg_names) else i}.{k}"
                      for k in range(arg.num_leaves)]
    return names


def split_inputs(ep, a):
    """The program's inputs the data feeds ([(name, example)]) and the target's example (or
    None): with --inputs, the leaves named after the dataset's arrays, and a last leaf named
    after none of them is the target; else the first leaf is the features and a second one
    the target."""
    leaves = user_inputs(ep)
    if a.inputs is None:
        if len(leaves) not in (1, 2):
            raise UserError(
                "inputs",
                f"the program takes {len(leaves)} inputs ({', '.join(n for n, _ in leaves)}); "
                "kiln feeds it one tensor of features (or features and targets, for "
                "train.loss = module), or the dataset's named arrays by name",
            )
        return leaves[:1], (leaves[1][1] if len(leaves) > 1 else None)
    arrays = json.loads(a.inputs)
    inputs = [(n, v) for n, v in leaves if n in arrays]
    rest = [(n, v) for n, v in leaves if n not in arrays]
    if len(rest) > 1 or (rest and leaves[-1][0] != rest[0][0]):
        raise UserError("inputs", f"the program's inputs {', '.join(n for n, _ in rest)} are "
                        f"not among the dataset's arrays ({', '.join(arrays)}); only its last "
                        "input may be the target (train.loss = module)")
    wrong = [why for why in (per_sample_mismatch(v, arrays[n]["shape"], DTYPES[arrays[n]["dtype"]],
                                                 f"array `{n}`") for n, v in inputs) if why]
    if wrong:
        raise UserError("input_mismatch", "; ".join(wrong))
    return inputs, (rest[0][1] if rest else None)


def batch_dim(val):
    """None for a symbolic (dynamic) batch dimension, else its fixed size."""
    d = val.shape[0]
    return None if isinstance(d, torch.SymInt) else int(d)


def per_sample_mismatch(val, want, dtype, what):
    """How one of the program's inputs differs from the dataset's `what` (samples, targets, an
    array): the shape after the batch dimension, the dtype; None where they agree."""
    per_sample = [int(d) for d in val.shape[1:]]
    if per_sample == list(want) and val.dtype == dtype:
        return None
    return (f"the program takes {what} of [batch, {', '.join(map(str, per_sample))}] "
            f"({str(val.dtype).replace('torch.', '')}); the dataset's {what} are {list(want)} "
            f"({str(dtype).replace('torch.', '')})")


def check_per_sample(val, want, dtype, what):
    """One of the program's inputs against the dataset's `what`: an error where they differ."""
    why = per_sample_mismatch(val, want, dtype, what)
    if why:
        raise UserError("input_mismatch", why)


def eval_mode_ops(gm):
    """(train-mode ops, eval-mode ops) among dropout and batch norm in the program's graph."""
    train, frozen = 0, 0
    for n in gm.graph.nodes:
        flag = training_flag(n)
        if flag is not None:
            if n.args[flag] is True:
                train += 1
            else:
                frozen += 1
    return train, frozen


def training_flag(node):
    """The index of a dropout's or batch norm's `train` argument, where the node is one."""
    if node.op != "call_function":
        return None
    name = str(node.target)
    if name in ("aten.dropout.default", "aten.feature_dropout.default",
                "aten.alpha_dropout.default", "aten.feature_alpha_dropout.default"):
        return 2
    if name == "aten.batch_norm.default":
        return 5
    return None


def to_eval(gm):
    """Switches an exported train-mode graph to eval mode in place: dropout off, batch norm on
    its running statistics, and no in-place updates of buffers (the batch counter)."""
    buffers = {n for n, _ in gm.named_buffers()}
    for n in list(gm.graph.nodes):
        flag = training_flag(n)
        if flag is not None:
            args = list(n.args)
            args[flag] = False
            n.args = tuple(args)
        elif in_place_on_buffer(n, buffers):
            n.replace_all_uses_with(n.args[0])
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()
    return gm


def in_place_on_buffer(node, buffers):
    if node.op != "call_function" or not str(node.target).startswith("aten.add_"):
        return False
    first = node.args[0] if node.args else None
    return getattr(first, "op", None) == "get_attr" and first.target in buffers


# --- the step ----------------------------------------------------------------------------


def pick_output(out, name):
    """The tensor the loss uses: the output itself, or the entry `name` of a dict/tuple."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        keys = list(out)
        if name is None:
            tensors = [k for k in keys if isinstance(out[k], torch.Tensor)]
            if len(tensors) == 1:
                return out[tensors[0]]
            raise UserError("output", f"the program returns a dict ({', '.join(map(str, keys))}); "
                            "say which entry the loss uses with model.output")
        if name not in out:
            raise UserError("output", f"model.output = {name!r} is not among the program's "
                            f"outputs ({', '.join(map(str, keys))})")
        return out[name]
    if isinstance(out, (tuple, list)):
        if name is None:
            raise UserError("output", f"the program returns {len(out)} outputs; say which the "
                            "loss uses with model.output (an index)")
        try:
            return out[int(name)]
        except (ValueError, IndexError):
            raise UserError("output", f"model.output = {name!r}: the program returns "
                            f"{len(out)} outputs (indexes 0–{len(out) - 1})") from None
    raise UserError("output", f"the program returns a {type(out).__name__}, not a tensor")


def kiln_loss(kind, out, target):
    """The loss as kiln computes it (crates/train/src/loss.rs): the output in float32, an
    output [B, 1] for targets [B] squeezed, the mean over the batch."""
    out = out.float()
    if kind != "cross_entropy" and out.dim() == target.dim() + 1 and out.shape[-1] == 1:
        out = out.squeeze(-1)
    if kind == "cross_entropy":
        return F.cross_entropy(out, target, ignore_index=-100)
    if kind == "mse":
        return F.mse_loss(out, target)
    if kind == "l1":
        return F.l1_loss(out, target)
    if kind == "huber":
        return F.huber_loss(out, target, delta=1.0)
    return F.binary_cross_entropy_with_logits(out, target)


OWN_LOSS_FORM = ("a program with train.loss = module returns its mean loss: a 0-dim tensor, a "
                 "dict with an entry \"loss\", or a tuple whose first entry is the loss")


def own_loss(out, name):
    """An own-loss program's (loss, prediction): the loss as OWN_LOSS_FORM says, the prediction
    the entry `name` (model.output) names, or None."""
    if isinstance(out, torch.Tensor):
        loss, pred = out, None
    elif isinstance(out, dict):
        if "loss" not in out:
            raise UserError("output", f"{OWN_LOSS_FORM}; it returns a dict of "
                            f"{', '.join(map(str, out))}")
        loss = out["loss"]
        pred = None if name is None else pick_output(out, name)
    elif isinstance(out, (tuple, list)) and out:
        loss = out[0]
        pred = None if name is None else pick_output(out, name)
    else:
        raise UserError("output", f"{OWN_LOSS_FORM}; it returns a {type(out).__name__}")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UserError("output", f"{OWN_LOSS_FORM}; its loss is {shape}, not one value")
    return loss.reshape(()).float(), pred


def check_loss_shapes(kind, out, target, classes):
    o, t = list(out.shape), list(target.shape)
    if kind != "cross_entropy" and len(o) == len(t) + 1 and o[-1] == 1:
        o = o[:-1]
    if kind == "cross_entropy":
        fits = len(o) == len(t) + 1 and o[0] == t[0] and o[2:] == t[1:]
        want = f"[batch, classes{''.join(', ' + str(d) for d in t[1:])}]"
        if fits and classes is not None and o[1] < classes:
            raise UserError("output_shape", f"the program's output has shape {list(out.shape)}: "
                            f"{o[1]} class scores, but the data has {classes} classes")
    else:
        fits = o == t
        want = f"the targets' shape {t}"
    if not fits:
        raise UserError("output_shape", f"train.loss = {kind} needs an output of {want}; the "
                        f"program's output has shape {list(out.shape)} for targets of shape {t}")


class EvalStep(nn.Module):
    """The program's prediction: its forward under the run's autocast, the output the loss
    uses picked out. It takes the program's input tensors (`xs`, then a target where the
    program takes one) flat, and calls the program with them in its own structure (a dict,
    several arguments)."""

    def __init__(self, model, a, device_type, in_spec):
        super().__init__()
        self.model, self.output, self.device_type = model, a.output, device_type
        self.amp = AMP[a.precision]
        self.in_spec = in_spec

    def call(self, leaves):
        import torch.utils._pytree as pytree

        args, kwargs = pytree.tree_unflatten(list(leaves), self.in_spec)
        with torch.autocast(self.device_type, dtype=self.amp or torch.float32,
                            enabled=self.amp is not None):
            return self.model(*args, **kwargs)

    def predict(self, xs):
        return pick_output(self.call(xs), self.output)

    def forward(self, *xs):
        return self.predict(xs)


class Step(EvalStep):
    """The program, its loss and the loss scale: what the joint graph differentiates."""

    def __init__(self, model, a, device_type, in_spec):
        super().__init__(model, a, device_type, in_spec)
        self.loss = a.loss

    def forward(self, *args):
        *xs, y, scale = args
        out = self.predict(xs)
        loss = kiln_loss(self.loss, out, y)
        return (loss * scale, loss.detach(), out.detach())


class OwnLossStep(EvalStep):
    """A program that takes the target and computes its own loss (train.loss = module)."""

    def losses(self, xs, y):
        loss, pred = own_loss(self.call([*xs, y]), self.output)
        return loss, (loss if pred is None else pred)

    def forward(self, *args):
        *xs, y, scale = args
        loss, pred = self.losses(xs, y)
        return (loss * scale, loss.detach(), pred.detach())


class OwnLossEval(OwnLossStep):
    """Its validation: the loss and the prediction, the program in eval mode."""

    def forward(self, *args):
        *xs, y = args
        return self.losses(xs, y)


class Predict(EvalStep):
    """An own-loss program's prediction alone (inference): the program fed a target of zeros
    (`check_predict` shows the prediction does not read it)."""

    def __init__(self, model, a, device_type, in_spec, target):
        super().__init__(model, a, device_type, in_spec)
        self.target_shape, self.target_dtype = [int(d) for d in target.shape[1:]], target.dtype

    def zeros(self, xs):
        x = xs[0]
        return torch.zeros([x.shape[0]] + self.target_shape, dtype=self.target_dtype,
                           device=x.device)

    def forward(self, *xs):
        return self.predict_with(xs, self.zeros(xs))

    def predict_with(self, xs, y):
        out = self.call([*xs, y])
        if self.output is None:
            raise UserError("output", "the program takes the target and computes its own loss; "
                            "to predict, name the entry of its output that holds the prediction "
                            "with model.output")
        return pick_output(out, self.output)


def check_predict(step, xs):
    """An own-loss program's prediction must not read the target: the eval-mode prediction
    with a target of zeros and with a random one must be equal."""
    zeros = step.zeros(xs)
    other = (torch.randint_like(zeros, 0, 2) if not zeros.is_floating_point()
             else torch.randn_like(zeros))
    with torch.no_grad():
        same = torch.equal(step.predict_with(xs, zeros), step.predict_with(xs, other))
    if not same:
        raise UserError("output", f"model.output = {step.output!r} depends on the target the "
                        "program takes, so kiln cannot predict without one: return a "
                        "prediction computed from the features alone")


def input_specs(a):
    """The data's inputs: [(dtype, per-sample shape)], one features tensor or the named arrays
    in the program's order (`a.input_names`)."""
    if a.inputs is None:
        return [(a.feature_dtype, shape_of(a.sample_shape))]
    arrays = json.loads(a.inputs)
    return [(arrays[n]["dtype"], list(arrays[n]["shape"])) for n in a.input_names]


def example(a, batch, device):
    """A batch of inputs (a list, in the program's order) and targets, seeded."""
    gen = torch.Generator().manual_seed(0)
    xs = []
    for dtype, shape in input_specs(a):
        if dtype == "int64" and a.inputs is not None:
            # Named integer arrays are categories, ids, lengths: 0 is valid in every table.
            x = torch.zeros([batch] + shape, dtype=torch.int64)
        elif dtype == "int64":
            x = torch.randint(0, 2, [batch] + shape, generator=gen)
        elif dtype == "bool":
            x = torch.rand([batch] + shape, generator=gen) > 0.5
        else:
            x = torch.randn([batch] + shape, generator=gen).to(DTYPES[dtype])
        xs.append(x.to(device))
    tshape = [batch] + shape_of(a.target_shape)
    if a.target_dtype == "int64":
        y = torch.randint(0, max(1, a.classes or 2), tshape, generator=gen)
    else:
        y = torch.rand(tshape, generator=gen)
    return xs, y.to(device)


def dry_run(step, xs, y, a):
    """One eager step: the output fits the loss, and every parameter gets a gradient."""
    if isinstance(step, OwnLossStep):
        loss, _ = step.losses(xs, y)
    else:
        out = step.predict(xs)
        check_loss_shapes(a.loss, out, y, a.classes)
        loss = kiln_loss(a.loss, out, y)
    params = {n: p for n, p in step.model.named_parameters() if p.requires_grad}
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    unused = [n for n, g in zip(params, grads) if g is None]
    if unused:
        raise UserError("unused_parameters", f"{len(unused)} parameter(s) get no gradient in "
                        f"the step: {', '.join(unused)}")


def freeze(model, patterns):
    """Keeps the parameters `patterns` names (a name, or a prefix of dotted names) at their
    values: they get no gradient in the step. Returns their names."""
    wanted = [p.strip() for p in patterns.split(",") if p.strip()]
    names = [n for n, _ in model.named_parameters()]
    frozen = []
    for pattern in wanted:
        hits = [n for n in names if n == pattern or n.startswith(pattern + ".")]
        if not hits:
            raise UserError("freeze", f"model.freeze = {pattern!r} names no parameter of the "
                            f"program (its parameters: {', '.join(names)})")
        frozen += hits
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    return sorted(set(frozen))


def symbolic(fake_mode, t, dynamic):
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    dims = [DimDynamic.DYNAMIC if dynamic else DimDynamic.STATIC]
    dims += [DimDynamic.STATIC] * (t.dim() - 1)
    return fake_mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims))


def joint(step, xs, y, scale, dynamic):
    """The joint forward+backward graph, traced with a symbolic batch where `dynamic`."""
    from torch._functorch.aot_autograd import aot_export_module
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    fm = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    args = tuple(symbolic(fm, x, dynamic) for x in xs)
    args += (symbolic(fm, y, dynamic), fm.from_tensor(scale))
    with fm:
        return aot_export_module(step, args, trace_joint=True, output_loss_index=0)


class Flat(nn.Module):
    def __init__(self, g):
        super().__init__()
        self.g = g

    def forward(self, *args):
        return tuple(self.g(*args))


class Functional(nn.Module):
    """`module` with its parameters and buffers as inputs, in `names` order."""

    def __init__(self, module, names):
        super().__init__()
        self.module, self.names = module, names

    def forward(self, *args):
        n = len(self.names)
        state = dict(zip(self.names, args[:n]))
        return torch.func.functional_call(self.module, state, args[n:])


def export_and_compile(module, args, dynamic_at, path, dynamic):
    """Exports `module(*args)` (batch dimension 0 of the args at `dynamic_at` symbolic where
    `dynamic`) and compiles it into the AOTInductor package `path`. Returns the batch sizes
    the package is valid for, `[lowest, highest]` (`None`: no limit), as its own input check
    states them (see `batch_ranges`)."""
    from torch.export import Dim

    shapes = None
    if dynamic:
        batch = Dim("batch")
        shapes = (tuple({0: batch} if i in dynamic_at else None for i in range(len(args))),)
    ep = torch.export.export(module, args, dynamic_shapes=shapes)
    with batch_ranges() as ranges, torch._inductor.config.patch(fx_graph_cache=False):
        torch._inductor.aoti_compile_and_package(ep, package_path=path)
    if not dynamic:
        fixed = args[dynamic_at[0]].shape[0]
        return [fixed, fixed]
    found = [ranges[i] for i in dynamic_at if i in ranges]
    if not found:
        raise RuntimeError("Inductor wrote no input checks for the symbolic batch, so the "
                           "package's valid batch sizes are unknown")
    return overlap(found)


def overlap(ranges):
    """The sizes every `[lowest, highest]` range of `ranges` holds (highest `None`: no limit)."""
    his = [r[1] for r in ranges if r[1] is not None]
    return [max(r[0] for r in ranges), min(his) if his else None]


@contextlib.contextmanager
def batch_ranges():
    """The range of dimension 0 of each input of the package compiled inside, by input index,
    as Inductor knows it when it writes the package's input checks: the trace's batch is a
    size hint, and a kernel choice made on it (on the CPU, whether a float sum over the batch
    accumulates in chunks) adds a guard that bounds the batch (e.g. <= 128). A package run
    outside that range runs code chosen for other sizes, so kiln never does (the manifest's
    `batch_range`: it compiles again, traced at the new size)."""
    from torch._inductor.codegen import cpp_wrapper_cpu
    from torch._inductor.virtualized import V
    from torch.utils._sympy.value_ranges import bound_sympy

    ranges = {}
    wrapper = cpp_wrapper_cpu.CppWrapperCpu
    checks = wrapper.generate_input_output_runtime_checks

    def record(self):
        env = V.graph.sizevars.shape_env
        for i, t in enumerate(V.graph.graph_inputs.values()):
            size = t.get_size() if hasattr(t, "get_size") else []
            if size and not isinstance(size[0], int) and size[0].free_symbols:
                r = bound_sympy(size[0], env.var_to_range)
                lo, hi = (None if math.isinf(b) else int(b) for b in (r.lower, r.upper))
                # A backed batch is traced as neither 0 nor 1, so its range starts at 2; that
                # is the trace's assumption, not a kernel choice (Inductor's own input check
                # waives it with aot_inductor.check_lowerbound = False), and 1 runs.
                ranges[i] = [1 if lo is None or lo <= 2 else lo, hi]
        return checks(self)

    wrapper.generate_input_output_runtime_checks = record
    try:
        yield ranges
    finally:
        wrapper.generate_input_output_runtime_checks = checks


def attention_backends(device, kernel):
    """The attention kernels a trace may pick on `device`: the explicit product alone where
    `kernel` is "math". On CUDA otherwise, cuDNN attention is left out: on an H100
    (torch 2.11.0+cu130) eager PyTorch picks it for bf16, and the joint graph holding it is exact
    when run eagerly, but its AOTInductor package computed another loss from the first step
    (1.39996 against eager's 1.42120) and the run did not learn. Flash, memory-efficient and
    math attention stay, in PyTorch's order of preference."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if kernel == "math":
        return sdpa_kernel([SDPBackend.MATH])
    if device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH])


# --- the attention kernel ------------------------------------------------------------------

# The batch the attention kernels are timed at, at least (a dynamic program is traced at 3).
ATTENTION_BATCH = 32
# The explicit product keeps each call's attention probabilities for the backward: at most
# this much in all (at ATTENTION_BATCH), or the fused kernel stays.
MATH_MEMORY = 256 << 20
# The explicit product must be this much faster to be chosen (timing noise is a few percent).
MATH_MARGIN = 0.97


def choose_attention(ep, a, device, fixed, target):
    """Which attention kernel the packages use, and why. On the CPU, PyTorch runs every
    scaled_dot_product_attention through its fused (flash) kernel, which at short sequences is
    slower than the explicit product (at 32×8×64×32, fp32, on an AMD EPYC without AVX-512:
    10.5 ms against 7.2 ms forward and backward). With `--attention auto` kiln times both on
    the program's own attention calls and takes the explicit product where it is faster,
    draws no attention dropout and keeps its probabilities small; the gradients are the same
    to fp32 rounding."""
    if a.attention != "auto":
        return {"kernel": a.attention, "chosen_by": "model.attention"}
    if device.type != "cpu":
        return {"kernel": "fused", "chosen_by": "PyTorch's choice on this device"}
    batch = fixed or max(a.batch_hint or 3, ATTENTION_BATCH)
    try:
        calls = attention_calls(ep, a, device, batch, target)
    except Exception as e:  # the measurement only chooses: the compile reports real faults
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        log(f"attention: fused; the measuring forward at batch {batch} failed: {first}")
        return {"kernel": "fused", "chosen_by": f"not measured: the forward at batch {batch} "
                f"failed ({type(e).__name__}: {first})"}
    if not calls:
        return {"kernel": "fused", "chosen_by": "no fused attention in the program"}
    if any(sig[4] > 0 for sig in calls):
        return {"kernel": "fused", "chosen_by": "attention dropout (the kernels draw "
                "differently; PyTorch's is kept)"}
    memory = sum(n * math.prod(sig[0][:-1]) * sig[1][-2] * 4 for sig, n in calls.items())
    if memory > MATH_MEMORY:
        return {"kernel": "fused", "chosen_by": f"the explicit product would keep "
                f"{memory >> 20} MiB of attention probabilities"}
    backward = a.what != "eval"
    fused, explicit = time_attention(calls, device, backward)
    kernel = "math" if explicit < MATH_MARGIN * fused else "fused"
    shapes = ", ".join(f"{n}× {'×'.join(map(str, sig[0]))}" for sig, n in calls.items())
    passes = "forward and backward" if backward else "forward"
    log(f"attention: {kernel}, measured: the explicit product {explicit * 1e3:.2f} ms, the "
        f"fused kernel {fused * 1e3:.2f} ms, {passes} ({shapes})")
    return {"kernel": kernel, "chosen_by": "measured", "fused_ms": fused * 1e3,
            "math_ms": explicit * 1e3}


def attention_calls(ep, a, device, batch, target):
    """The fused attention calls of one forward at `batch` (in train mode, or in eval mode
    where only the eval forward is compiled), by signature (query, key and value shapes, dtype,
    dropout, causal, mask shape and dtype, scale): how many."""
    from torch.utils._python_dispatch import TorchDispatchMode

    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    calls = {}

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is fused:
                q, k, v = args[:3]
                dropout = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
                causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
                mask = kwargs.get("attn_mask")
                sig = (tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, float(dropout),
                       bool(causal), None if mask is None else (tuple(mask.shape), mask.dtype),
                       kwargs.get("scale"))
                calls[sig] = calls.get(sig, 0) + 1
            return func(*args, **kwargs)

    module, in_spec = ep.module().to(device), ep.call_spec.in_spec
    xs, y = example(a, batch, device)
    if a.what == "eval":
        step, extra = eval_step(to_eval(module), a, device.type, in_spec, target, y)
        forward, args = step, (*xs, *extra)
    else:
        step = EvalStep(module, a, device.type, in_spec)
        forward, args = step.call, ([*xs, y] if target is not None else xs,)
    with torch.no_grad(), Record():
        forward(*args)
    return calls


def time_attention(calls, device, backward, rounds=7):
    """Seconds of the forward (and `backward`) of every call in `calls`, fused and explicit:
    the medians of `rounds` alternating rounds, after one warm-up each."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator().manual_seed(0)

    def tensor(shape, dtype, grad):
        t = torch.randn(shape, generator=gen).to(device, dtype)
        return t.requires_grad_(grad)

    cases = []
    for (qs, ks, vs, dtype, _, causal, mask, scale), n in calls.items():
        q, k, v = (tensor(s, dtype, backward) for s in (qs, ks, vs))
        m = None if mask is None else (tensor(mask[0], torch.float32, False) > 0
                                       if mask[1] == torch.bool else tensor(*mask, False))
        grad = tensor(qs[:-1] + vs[-1:], dtype, False)
        cases.append((q, k, v, m, causal, scale, grad, n))

    def run(backend):
        with sdpa_kernel([backend]):
            start = time.perf_counter()
            for q, k, v, m, causal, scale, grad, n in cases:
                for _ in range(n):
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                         scale=scale,
                                                         enable_gqa=q.shape[-3] != k.shape[-3])
                    if backward:
                        torch.autograd.grad(out, (q, k, v), grad)
            return time.perf_counter() - start

    kernels = (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH)
    times = {b: [] for b in kernels}
    for i in range(rounds + 1):
        for b in kernels:
            t = run(b)
            if i:
                times[b].append(t)
    return tuple(sorted(times[b])[rounds // 2] for b in kernels)


def compile_train(ep, a, device, dynamic, fixed, checks):
    device_type = device.type
    gm = ep.module().to(device)
    frozen = freeze(gm, a.freeze)
    step = (OwnLossStep if a.loss == "module" else Step)(gm, a, device_type, ep.call_spec.in_spec)
    xs, y = example(a, fixed or a.batch_hint or 3, device)
    scale = torch.ones((), device=device)
    dry_run(step, xs, y, a)
    g, sig = joint(step, xs, y, scale, dynamic)
    params, buffers = dict(step.named_parameters()), dict(step.named_buffers())
    strip = len("model.")
    outputs = [str(n) for n in next(iter(n for n in g.graph.nodes if n.op == "output")).args[0]]
    n_mut = len(sig.buffers_to_mutate)
    grads = [sig.backward_signature.gradients_to_parameters[o] for o in outputs[n_mut + 3:]]
    inputs = ([params[n].detach() for n in sig.parameters] + [buffers[n] for n in sig.buffers]
              + [*xs, y, scale])
    n_state = len(sig.parameters) + len(sig.buffers)
    path = os.path.join(a.out, "train.pt2")
    dynamic_at = tuple(range(n_state, n_state + len(xs) + 1))
    batch_range = export_and_compile(Flat(g), tuple(inputs), dynamic_at, path, dynamic)
    checks["train"] = lambda state, xs, y: g(*state, *xs, y, scale)[n_mut + 1:]
    return {
        "parameters": [n[strip:] for n in sig.parameters],
        "buffers": [n[strip:] for n in sig.buffers],
        "mutated_buffers": [sig.buffers_to_mutate[o][strip:] for o in outputs[:n_mut]],
        "gradients": [n[strip:] for n in grads],
        "frozen": frozen,
        "batch_range": {"train": batch_range},
    }


def eval_step(gm, a, device_type, in_spec, target, y):
    """The eval forward's module and what it takes after the features: the prediction; for an
    own-loss program in training, its (loss, prediction) given `y`; for one in inference, its
    prediction alone (fed a target of zeros shaped as `target`)."""
    if target is None:
        return EvalStep(gm, a, device_type, in_spec), ()
    if a.loss == "module":
        return OwnLossEval(gm, a, device_type, in_spec), (y,)
    return Predict(gm, a, device_type, in_spec, target), ()


def compile_eval(ep, a, device, dynamic, fixed, manifest, target, checks):
    """The eval forward: features to the prediction; for an own-loss program in training,
    features and targets to (loss, prediction); for one in inference, its prediction alone."""
    gm = to_eval(ep.module().to(device))
    xs, y = example(a, fixed or a.batch_hint or 3, device)
    step, extra = eval_step(gm, a, device.type, ep.call_spec.in_spec, target, y)
    if extra:
        manifest["eval_takes_target"] = True
    if isinstance(step, Predict):
        check_predict(step, xs)
    names = ["model." + n for n in manifest["parameters"] + manifest["buffers"]]
    state = state_of(step)
    args = tuple(state[n].detach() for n in names) + tuple(xs) + extra
    path = os.path.join(a.out, "eval.pt2")
    dynamic_at = tuple(range(len(names), len(names) + len(xs) + len(extra)))
    module = Functional(step, names)
    manifest.setdefault("batch_range", {})["eval"] = export_and_compile(
        module, args, dynamic_at, path, dynamic)
    checks["eval"] = lambda state, xs, y: module(*state, *xs, *((y,) if extra else ()))


def check_loss_inputs(a, target):
    """train.loss = module goes with a program that takes the target, and only with one."""
    if a.loss == "module" and target is None:
        raise UserError("loss", f"train.loss = module: {OWN_LOSS_FORM}, and takes (features, "
                        "target); this program takes the features alone: export a module whose "
                        "forward(features, target) returns the loss, or use a loss of kiln's")
    if a.loss not in (None, "module") and target is not None:
        raise UserError("loss", f"the program takes the target as well as the features, so it "
                        f"computes its own loss: set train.loss = module (not {a.loss})")


def check_compiler():
    """AOTInductor compiles C++: a machine without a compiler is told what to install."""
    from torch._inductor import cpp_builder, exc

    try:
        cpp_builder.get_cpp_compiler()
    except exc.InvalidCxxCompiler:
        wanted = [c for c in torch._inductor.config.cpp.cxx if c] or ["g++"]
        raise UserError("no_compiler", "compiling a program needs a C++ compiler, and none was "
                        f"found (tried {', '.join(wanted)}): install one (Debian/Ubuntu: apt "
                        "install g++; Fedora: dnf install gcc-c++; macOS: xcode-select "
                        "--install) or point CXX at one") from None


def remember_vec_isa_checks():
    """Inductor picks the CPU's vector instructions by compiling a probe for each candidate
    (AVX2, AVX-512, its VNNI and BF16 extensions, AMX) and loading it in a fresh Python that
    imports torch: 1.5-2.5 s a probe, three to six probes in every compile process, a third of
    a small program's compile. A probe that passed once passes again for the same CPU, compiler
    and torch, so its answer is kept beside Inductor's own cache, keyed by all three (a cache
    shared by other machines is keyed apart). Only passes are kept: a probe that failed is
    probed again, so a passing compiler installed later is found. The generated code is what
    Inductor would have generated: the answers are the same."""
    from torch._inductor import cpp_builder, cpu_vec_isa
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    probe = getattr(cpu_vec_isa.VecISA, "check_build", None)
    if probe is None:
        return
    path = os.path.join(cache_dir(), "kiln-vec-isa.json")
    machine = "\0".join([torch.__version__, cpu_flags(), compiler_identity(cpp_builder)])

    def remembered(isa, code):
        key = hashlib.sha256("\0".join([machine, isa._arch_flags, code]).encode()).hexdigest()
        if key in read_json(path):
            return True
        passed = probe(isa, code)
        if passed:
            write_json_atomically(path, read_json(path) | {key: True})
        return passed

    cpu_vec_isa.VecISA.check_build = remembered


def cpu_flags():
    """The CPU's feature flags as Linux reports them ('' elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def compiler_identity(cpp_builder):
    """Inductor's C++ compiler and what it says of its version."""
    cxx = cpp_builder.get_cpp_compiler()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{cxx}\0{version}"


def read_json(path):
    try:
        with open(path) as f:
            value = json.load(f)
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}


def write_json_atomically(path, value):
    """Writes `value` to `path` through a temporary file, so that a reader never sees half;
    a failure to write only loses the memo."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(value, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def compile_packages(ep, a, device, batch, manifest, target, checks):
    """The train step and the eval forward, as `a.what` asks; the manifest gains their names,
    `checks` their eager twins (for `write_check`)."""
    dynamic, fixed = batch
    if a.what in ("train", "both"):
        if a.loss is None:
            raise UserError("loss", "the train step needs --loss")
        log("compiling the train step (forward, loss and backward) with AOTInductor…")
        manifest.update(compile_train(ep, a, device, dynamic, fixed, checks))
    if a.what in ("eval", "both"):
        if "parameters" not in manifest:
            gm = ep.module()
            manifest["parameters"] = [n for n, _ in gm.named_parameters()]
            manifest["buffers"] = [n for n, _ in gm.named_buffers()]
        log("compiling the eval forward…")
        compile_eval(ep, a, device, dynamic, fixed, manifest, target, checks)


def compile_all(a):
    started = time.time()
    device = torch.device(a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    torch._inductor.config.fallback_random = True
    # A backed batch is traced as neither 0 nor 1; a batch of 1 runs all the same (see
    # batch_ranges), so the packages' own input check (AOTI_RUNTIME_CHECK_INPUTS) allows it.
    torch._inductor.config.aot_inductor.check_lowerbound = False
    ep = load_program(a.program)
    # The weights as saved, before any dry run: ep.module() shares the program's tensors, so a
    # train-mode forward would move batch-norm statistics in them.
    initial = {n: t.detach().clone() for n, t in state_of(ep.module()).items()}
    check_compiler()
    remember_vec_isa_checks()
    inputs, target = split_inputs(ep, a)
    a.input_names = [n for n, _ in inputs]
    val = inputs[0][1]
    if a.inputs is None:
        check_per_sample(val, shape_of(a.sample_shape), DTYPES[a.feature_dtype], "samples")
    check_loss_inputs(a, target)
    if target is not None and a.loss is not None:
        check_per_sample(target, shape_of(a.target_shape), DTYPES[a.target_dtype], "targets")
    fixed = batch_dim(val)
    dynamic = fixed is None
    train_ops, frozen_ops = eval_mode_ops(ep.module())
    manifest = {
        "program_sha256": sha256_of(a.program),
        "torch": torch.__version__,
        "device": str(device),
        "batch": "dynamic" if dynamic else fixed,
        "loss": a.loss,
        "precision": a.precision,
        "output": a.output,
        "eval_mode_ops": frozen_ops,
        "train_mode_ops": train_ops,
        "own_loss": a.loss == "module",
        "inputs": a.input_names if a.inputs is not None else ["features"],
        "predicts": target is None or a.output is not None,
    }
    os.makedirs(a.out, exist_ok=True)
    checks = {}
    manifest["attention"] = choose_attention(ep, a, device, fixed, target)
    kernel = manifest["attention"]["kernel"]
    with attention_backends(device, kernel):
        compile_packages(ep, a, device, (dynamic, fixed), manifest, target, checks)
    names = manifest["parameters"] + manifest["buffers"]
    write_safetensors({n: initial[n] for n in names}, os.path.join(a.out, "initial.safetensors"))
    with attention_backends(device, kernel):
        batch = fixed or within(CHECK_BATCH, manifest["batch_range"].values())
        manifest["check_batch"] = write_check(a, device, batch,
                                              [initial[n].to(device) for n in names], checks)
    manifest["compile_s"] = time.time() - started
    return manifest


# The batch of the compiled packages' check, for a program with a dynamic batch: not the
# trace's example batch (3), so the check runs the packages at another size.
CHECK_BATCH = 8


def within(n, ranges):
    """`n`, or the size nearest to it that every package's `[lowest, highest]` range holds."""
    lo, hi = overlap(list(ranges))
    return max(lo, n if hi is None else min(n, hi))


def write_check(a, device, batch, state, checks):
    """What PyTorch eager computes from the initial weights on one batch, for kiln to check the
    packages against before it trains with them (crates/train/src/program/check.rs): the
    batch (`input.K` for each input, `y`), the train step's loss and gradients (`train.loss`, `train.grad.N` in
    the manifest's gradient order), the eval forward's outputs (`eval.N`). Random ops draw
    from the generator seeded with 0, as kiln seeds it for the check. Returns the batch."""
    xs, y = example(a, batch, device)
    out = {f"input.{k}": x for k, x in enumerate(xs)} | {"y": y}
    with torch.no_grad():
        for what, run in sorted(checks.items()):
            torch.manual_seed(0)
            values = run(state, xs, y)
            values = values if isinstance(values, (tuple, list)) else (values,)
            prefix = what
            if what == "train":
                out["train.loss"] = values[0].float().reshape(1)
                values, prefix = values[2:], "train.grad"
            for i, v in enumerate(values):
                out[f"{prefix}.{i}"] = v
    write_safetensors(out, os.path.join(a.out, "check.safetensors"))
    return batch


def state_of(module):
    """A module's parameters and buffers by name."""
    return dict(module.named_parameters()) | dict(module.named_buffers())


SAFETENSORS_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}


def write_safetensors(tensors, path):
    """The safetensors format (an 8-byte header length, a JSON header, the raw data), written
    here so that neither the safetensors package nor numpy is needed."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in SAFETENSORS_DTYPES:
            raise UserError("dtype", f"{name} is {t.dtype}, which kiln does not train")
        n = t.numel() * t.element_size()
        header[name] = {"dtype": SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        blobs.append(ctypes.string_at(t.data_ptr(), n) if n else b"")
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# --- export (kiln export) -------------------------------------------------------------------


def parse_export_args(argv):
    p = argparse.ArgumentParser(description="writes a trained program (kiln export)")
    p.add_argument("--program", required=True, help="the checkpoint's model.pt2")
    p.add_argument("--weights", required=True, help="the checkpoint's model.safetensors")
    p.add_argument("--out", required=True)
    p.add_argument("--format", choices=("program", "onnx"), default="program")
    p.add_argument("--mode", choices=("eval", "train"), default="eval")
    p.add_argument("--opset", type=int, default=18)
    p.add_argument("--meta", action="append", default=[], help="KEY=VALUE for ONNX metadata")
    p.add_argument("--log", default=None)
    return p.parse_args(argv)


SAFETENSORS_TORCH = {v: k for k, v in SAFETENSORS_DTYPES.items()}


def read_safetensors(path):
    """A safetensors file's tensors (read here: no numpy or safetensors package needed)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = SAFETENSORS_TORCH[meta["dtype"]]
        t = (torch.frombuffer(bytearray(body[start:end]), dtype=dtype) if end > start
             else torch.empty(0, dtype=dtype))
        out[name] = t.reshape(meta["shape"])
    return out


def put_weights(ep, weights):
    """The program's parameters and buffers replaced by `weights`, by name: every one must be
    there in its shape and dtype, and nothing else."""
    module = ep.module()
    names = list(state_of(module))
    missing = [n for n in names if n not in weights]
    extra = [n for n in weights if n not in names]
    if missing or extra:
        raise UserError("weights", f"the checkpoint's weights do not fit the program: missing "
                        f"{missing}, not in the program {extra}")
    for name in names:
        new, table = weights[name], ep.state_dict if name in ep.state_dict else ep.constants
        old = table[name]
        if old.shape != new.shape or old.dtype != new.dtype:
            raise UserError("weights", f"{name}: the program has {list(old.shape)} {old.dtype}, "
                            f"the checkpoint {list(new.shape)} {new.dtype}")
        table[name] = (torch.nn.Parameter(new, requires_grad=old.requires_grad)
                       if isinstance(old, torch.nn.Parameter) else new)


def eval_program(ep):
    """The program in eval mode, exported again with its inputs' dynamic batch."""
    from torch.export import Dim

    import torch.utils._pytree as pytree

    vals = [v for _, v in user_inputs(ep)]
    fixed = batch_dim(vals[0])
    leaves = [torch.zeros([fixed or 2] + [int(d) for d in v.shape[1:]], dtype=v.dtype)
              for v in vals]
    args, kwargs = pytree.tree_unflatten(leaves, ep.call_spec.in_spec)
    batch = Dim("batch")
    shapes = None
    if not fixed:
        shapes, _ = pytree.tree_unflatten([{0: batch} for _ in vals], ep.call_spec.in_spec)
    return torch.export.export(to_eval(ep.module()), args, kwargs, dynamic_shapes=shapes)


def check_written(path, weights):
    """The written program read back: every tensor equal to the checkpoint's, bit for bit."""
    state = state_of(torch.export.load(path).module())
    for name, want in weights.items():
        got = state[name].detach()
        if got.dtype != want.dtype or not torch.equal(got, want):
            raise UserError("weights", f"{name} read back from {path} differs from the "
                            "checkpoint's")


def to_onnx(ep, a):
    """The eval-mode program as ONNX through PyTorch's exporter for exported programs."""
    try:
        import onnx
    except ImportError as e:
        raise UserError("onnx_packages", f"the onnx package is missing ({e})") from None
    if len(ep.graph_signature.user_inputs) != 1:
        raise UserError("inputs", "only a program of one input tensor is written as ONNX (this "
                        "one takes several, or the target for its own loss): export it as a "
                        "program")
    torch.onnx.export(ep, f=a.out, dynamo=True, opset_version=a.opset, verbose=False)
    model = onnx.load(a.out)
    for kv in a.meta:
        key, value = kv.split("=", 1)
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, a.out)
    return {"opset": model.opset_import[0].version, "nodes": len(model.graph.node)}


def export_all(a):
    started = time.time()
    ep = load_program(a.program)
    weights = read_safetensors(a.weights)
    put_weights(ep, weights)
    if a.mode == "eval" or a.format == "onnx":
        ep = eval_program(ep)
    if a.format == "onnx":
        facts = to_onnx(ep, a)
    else:
        torch.export.save(ep, a.out)
        check_written(a.out, weights)
        facts = {}
    return facts | {"tensors": len(weights), "mode": a.mode, "torch": torch.__version__,
                    "seconds": round(time.time() - started, 2)}


def main():
    exporting = sys.argv[1:2] == ["export"]
    a = parse_export_args(sys.argv[2:]) if exporting else parse_args()
    try:
        result = export_all(a) if exporting else compile_all(a)
        code = 0
    except UserError as e:
        result, code = {"error": {"kind": e.kind, "message": str(e)}}, 2
    except Exception as e:  # noqa: BLE001 - Inductor's own failures: first lines and the log
        log_path = a.log or (a.out + ".log" if exporting else os.path.join(a.out, "compile.log"))
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        with open(log_path, "w") as f:
            traceback.print_exc(file=f)
        kind = "export" if exporting else "compile"
        result = {"error": {"kind": kind, "message": first_line(e), "log": log_path}}
        code = 1
    print(json.dumps(result), flush=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
