"""tori-fold-constants: evaluate torch-dialect ops whose operands are all constants
with PyTorch on the host, and put literals in their place.

Rewrites: a `torch.aten.*` op (or an allowed `torch.prim.*` op) whose operands are all
constants (`torch.vtensor.literal`, `torch.constant.int/float/bool/none/str/device`, a
`torch.prim.ListConstruct` of constants, a `tori.assumed_constant`: the value of its
operand) runs as `torch.ops.aten.<op>.<overload>`, operands given positionally to
the op's schema; its tensor results become `torch.vtensor.literal`s of the same
`!torch.vtensor` type, its int/float/bool results `torch.constant.*`. One sweep in
program order folds whole chains, since an op's constant operands were folded before
it is visited. The constants that nothing uses any more are erased.

Never changes: ops with side effects or randomness (`rand*`, `dropout`, `bernoulli`,
`normal`, `uniform`, `multinomial`, in-place `*_` ops, any op whose schema mutates
an argument or is tagged nondeterministic_seeded), `empty*` ops (their contents are
undefined), results of more than FOLD_LIMIT elements, results whose type is not
static or whose dtype a literal cannot hold exactly (complex, float8, ...), and
results that PyTorch computes with another shape or dtype than the IR declares.
An op that PyTorch cannot evaluate is left as it is; this pass never fails a compile.

Example:
    %0 = torch.vtensor.literal(dense<[1.0, 2.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
    %int2 = torch.constant.int 2
    %1 = torch.aten.mul.Scalar %0, %int2 : !torch.vtensor<[2],f32>, !torch.int -> !torch.vtensor<[2],f32>
becomes
    %1 = torch.vtensor.literal(dense<[2.0, 4.0]> : tensor<2xf32>) : !torch.vtensor<[2],f32>
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch_mlir import ir

from tori.dialects.tori import AssumedConstantOp
from tori.passes.registry import register_pass

log = logging.getLogger("tori.passes.fold_constants")

# Elements in one folded result: above it the op stays, so that folding never blows
# up the module (a broadcast of a scalar to a large shape is cheaper as an op).
FOLD_LIMIT = 1 << 20

# vtensor dtype -> (torch dtype, builtin element type, numpy dtype of its bytes).
# A dtype missing here (complex, float8, unsigned wider than 8 bits) is never folded.
_DTYPES: dict[str, tuple[torch.dtype, str, Any]] = {
    "f16": (torch.float16, "f16", np.float16),
    "bf16": (torch.bfloat16, "bf16", np.int16),  # numpy has no bfloat16: its bits as int16
    "f32": (torch.float32, "f32", np.float32),
    "f64": (torch.float64, "f64", np.float64),
    "i1": (torch.bool, "i1", np.bool_),
    "si8": (torch.int8, "si8", np.int8),
    "ui8": (torch.uint8, "ui8", np.uint8),
    "si16": (torch.int16, "si16", np.int16),
    "si32": (torch.int32, "si32", np.int32),
    "si64": (torch.int64, "si64", np.int64),
}
ASSUMED_CONSTANT = AssumedConstantOp.OPERATION_NAME
_VTENSOR = re.compile(r"^!torch\.vtensor<\[([^\]]*)\],(\w+)>$")

# Words in an op's name that mean randomness or undefined contents.
_NEVER_FOLD_WORDS = ("rand", "dropout", "bernoulli", "normal", "uniform", "multinomial",
                     "exponential", "cauchy", "geometric", "poisson", "empty")
# torch.prim ops that are plain functions of their operands; the others carry
# control flow, side effects or list plumbing.
_PRIM_OPS = frozenset({"torch.prim.NumToTensor.Scalar"})
# Ops whose tensor operand contributes only its shape and dtype (the `*_like` family
# built on `empty_strided` by AOTAutograd): it need not be constant.
_SHAPE_ONLY_OPERAND = frozenset({"torch.aten.full_like", "torch.aten.zeros_like", "torch.aten.ones_like"})

_SCALAR_CONSTANTS = {
    "torch.constant.int": lambda attr: ir.IntegerAttr(attr).value,
    "torch.constant.float": lambda attr: ir.FloatAttr(attr).value,
    "torch.constant.bool": lambda attr: ir.BoolAttr(attr).value,
    "torch.constant.str": lambda attr: ir.StringAttr(attr).value,
}


class _NotConstant(Exception):
    """An operand whose value is not known at compile time."""


@dataclass(frozen=True)
class _TensorType:
    shape: tuple[int, ...]
    vtensor_dtype: str

    @staticmethod
    def parse(type_: ir.Type) -> "_TensorType | None":
        """The static shape and supported dtype of a `!torch.vtensor`, else None."""
        match = _VTENSOR.match(str(type_))
        if not match or match.group(2) not in _DTYPES or "?" in match.group(1):
            return None
        shape = tuple(int(d) for d in match.group(1).split(",") if d)
        return _TensorType(shape, match.group(2))

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.vtensor_dtype][0]

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def builtin(self) -> ir.RankedTensorType:
        return ir.RankedTensorType.get(list(self.shape), ir.Type.parse(_DTYPES[self.vtensor_dtype][1]))


@dataclass
class _Folder:
    """State of one run: values of the literals read or made so far, and the
    module's resource blobs (read from its text once, when first needed)."""

    module: ir.Operation
    limit: int = FOLD_LIMIT
    tensors: dict[ir.Operation, torch.Tensor] = field(default_factory=dict)
    blobs: dict[str, bytes] | None = None

    def value(self, value: ir.Value) -> Any:
        owner = value.owner
        if not isinstance(owner, (ir.OpView, ir.Operation)):
            raise _NotConstant  # a block argument
        op = owner.operation
        if op.name == "torch.vtensor.literal":
            if op not in self.tensors:
                self.tensors[op] = self._read_literal(op)
            return self.tensors[op]
        if op.name in _SCALAR_CONSTANTS:
            return _SCALAR_CONSTANTS[op.name](op.attributes["value"])
        if op.name == "torch.constant.none":
            return None
        if op.name == "torch.constant.device":
            # IREE places tensors itself: the values are the same on every device.
            return torch.device("cpu")
        if op.name == "torch.prim.ListConstruct":
            return [self.value(operand) for operand in op.operands]
        if op.name == ASSUMED_CONSTANT:
            return self.value(op.operands[0])  # the origin of a constant: its value is its operand's
        raise _NotConstant

    def _read_literal(self, op: ir.Operation) -> torch.Tensor:
        type_ = _TensorType.parse(op.results[0].type)
        if type_ is None:
            raise _NotConstant
        attr = op.attributes["value"]
        if isinstance(attr, ir.DenseElementsAttr):
            return _dense_to_tensor(attr, type_)
        return self._resource_to_tensor(str(attr), type_)

    def _resource_to_tensor(self, attr_text: str, type_: _TensorType) -> torch.Tensor:
        match = re.match(r"dense_resource<([^>]+)>", attr_text)
        if self.blobs is None:
            self.blobs = _resource_blobs(str(self.module))
        blob = self.blobs.get(match.group(1)) if match else None
        if blob is None:
            raise _NotConstant
        data = np.frombuffer(blob[4:], dtype=_DTYPES[type_.vtensor_dtype][2])  # 4 bytes of alignment first
        return _from_numpy(data.reshape(type_.shape), type_)


def _resource_blobs(module_text: str) -> dict[str, bytes]:
    """The `dialect_resources` blobs of a printed module, by name."""
    section = module_text.partition("dialect_resources:")[2]
    return {name.strip('"'): bytes.fromhex(hex_)
            for name, hex_ in re.findall(r'([\w.$-]+|"[^"]+"): "0x([0-9A-Fa-f]*)"', section)}


def _dense_to_tensor(attr: ir.DenseElementsAttr, type_: _TensorType) -> torch.Tensor:
    if type_.vtensor_dtype == "bf16":
        return _bf16_from_text(str(attr), type_)
    if attr.is_splat:
        return torch.full(type_.shape, _element(attr.get_splat_value()), dtype=type_.dtype)
    return torch.from_numpy(np.array(attr).copy()).reshape(type_.shape)


def _bf16_from_text(text: str, type_: _TensorType) -> torch.Tensor:
    """The bindings give bf16 elements neither as a buffer nor as floats; their text
    holds either the raw bits in hex or decimals that are exact bf16 values."""
    body = text.partition("dense<")[2].rpartition(">")[0].rpartition(">")[0]
    if body.startswith('"0x'):
        bits = np.frombuffer(bytes.fromhex(body[3:].partition('"')[0]), dtype=np.int16)
        return torch.from_numpy(bits.copy()).view(torch.bfloat16).reshape(type_.shape)
    if re.search(r"0x|inf|nan", body):  # special values printed as bits: not read
        raise _NotConstant
    values = [float(v) for v in re.findall(r"[-+]?[0-9.]+(?:e[-+]?[0-9]+)?", body)]
    if len(values) == 1:
        return torch.full(type_.shape, values[0], dtype=torch.bfloat16)
    return torch.tensor(values, dtype=torch.bfloat16).reshape(type_.shape)


def _element(attr: ir.Attribute) -> Any:
    if isinstance(attr, ir.BoolAttr):
        return attr.value
    if isinstance(attr, ir.IntegerAttr):
        return attr.value
    return ir.FloatAttr(attr).value


def _from_numpy(array: np.ndarray, type_: _TensorType) -> torch.Tensor:
    tensor = torch.from_numpy(array.copy())
    return tensor.view(torch.bfloat16) if type_.vtensor_dtype == "bf16" else tensor


def _overload(op: ir.Operation) -> torch._ops.OpOverload | None:
    """The PyTorch op that `op` names, if it is one tori may evaluate."""
    name = op.name
    if name.startswith("torch.aten."):
        namespace, rest = torch.ops.aten, name[len("torch.aten."):]
    elif name in _PRIM_OPS:
        namespace, rest = torch.ops.prim, name[len("torch.prim."):]
    else:
        return None
    packet_name, _, overload_name = rest.partition(".")
    if any(word in packet_name.lower() for word in _NEVER_FOLD_WORDS):
        return None
    if packet_name.endswith("_") and not packet_name.endswith("__"):
        return None  # in place
    try:
        overload = getattr(getattr(namespace, packet_name), overload_name or "default")
    except AttributeError:
        return None
    if overload._schema.is_mutable or torch.Tag.nondeterministic_seeded in overload.tags:
        return None
    return overload


def _result_kinds(op: ir.Operation, limit: int) -> list[_TensorType | str] | None:
    """What each result becomes: a literal of that type, or a scalar constant
    (`int`, `float`, `bool`); None when one of them cannot be a constant."""
    kinds: list[_TensorType | str] = []
    for result in op.results:
        text = str(result.type)
        if text in ("!torch.int", "!torch.float", "!torch.bool"):
            kinds.append(text[len("!torch."):])
            continue
        type_ = _TensorType.parse(result.type)
        if type_ is None or type_.numel > limit:
            return None
        kinds.append(type_)
    return kinds or None


def _arguments(folder: _Folder, op: ir.Operation, overload: torch._ops.OpOverload) -> tuple[list, dict]:
    schema = overload._schema
    if len(op.operands) != len(schema.arguments):
        raise _NotConstant
    args, kwargs = [], {}
    for index, (operand, argument) in enumerate(zip(op.operands, schema.arguments)):
        if index == 0 and op.name in _SHAPE_ONLY_OPERAND:
            value = _placeholder(operand)
        else:
            value = folder.value(operand)
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return args, kwargs


def _placeholder(operand: ir.Value) -> torch.Tensor:
    type_ = _TensorType.parse(operand.type)
    if type_ is None:
        raise _NotConstant
    return torch.zeros(type_.shape, dtype=type_.dtype)


def _matches(value: Any, kind: _TensorType | str) -> bool:
    if isinstance(kind, _TensorType):
        return (isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype == kind.dtype
                and tuple(value.shape) == kind.shape)
    return type(value) is {"int": int, "float": float, "bool": bool}[kind]


def _tensor_attr(tensor: torch.Tensor, type_: _TensorType) -> ir.Attribute:
    """A literal's value: a splat, or every element inline."""
    builtin = type_.builtin()
    flat = tensor.detach().contiguous().reshape(-1)
    bits = flat.view(torch.int16) if type_.vtensor_dtype == "bf16" else flat
    array = bits.numpy()
    if array.size and (array == array[0]).all():
        element = builtin.element_type
        first = flat[0].item()
        scalar = (ir.FloatAttr.get(element, first) if flat.dtype.is_floating_point
                  else ir.IntegerAttr.get(element, int(first)))
        return ir.DenseElementsAttr.get_splat(builtin, scalar)
    # Always inline, never a resource blob: IREE crashes iterating an i1 blob
    # (ElementsAttr has no APInt iteration), and its input conversion copies other blobs
    # into ones that iree-compile cannot write as bytecode, which its phases hand on
    # (targets/iree_compile.py, PHASES: Llama's four identical causal masks, GPT-2's
    # position ids).
    return ir.DenseElementsAttr.get(array.reshape(type_.shape), type=builtin.element_type, shape=list(type_.shape))


def _constant_op(value: Any, kind: _TensorType | str, result_type: ir.Type) -> ir.Operation:
    if isinstance(kind, _TensorType):
        return ir.Operation.create("torch.vtensor.literal", results=[result_type],
                                   attributes={"value": _tensor_attr(value, kind)})
    attr = {"int": lambda: ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value),
            "float": lambda: ir.FloatAttr.get_f64(value),
            "bool": lambda: ir.BoolAttr.get(value)}[kind]()
    return ir.Operation.create(f"torch.constant.{kind}", results=[result_type], attributes={"value": attr})


def _fold(folder: _Folder, op: ir.Operation) -> bool:
    """Replace `op` by constants if it can be evaluated; True when it was."""
    overload = _overload(op)
    kinds = _result_kinds(op, folder.limit) if overload is not None else None
    if kinds is None:
        return False
    try:
        args, kwargs = _arguments(folder, op, overload)
    except _NotConstant:
        return False
    except Exception as error:  # a literal in a form this pass cannot read
        log.debug("cannot read the operands of %s: %s", op.name, error)
        return False
    try:
        with torch.no_grad():
            results = overload(*args, **kwargs)
    except Exception as error:  # PyTorch rejects what the IR holds: leave the op to IREE
        log.debug("cannot evaluate %s: %s", op.name, error)
        return False
    results = list(results) if isinstance(results, (tuple, list)) else [results]
    if len(results) != len(kinds) or not all(_matches(v, k) for v, k in zip(results, kinds)):
        return False
    try:
        with ir.InsertionPoint(op), op.location:
            constants = [_constant_op(v, k, r.type) for v, k, r in zip(results, kinds, op.results)]
    except Exception as error:  # a value the attribute cannot hold (e.g. an int beyond i64)
        log.debug("cannot represent the result of %s: %s", op.name, error)
        return False
    for constant, value, result in zip(constants, results, op.results):
        if constant.name == "torch.vtensor.literal":
            folder.tensors[constant] = value
        result.replace_all_uses_with(constant.results[0])
    op.erase()
    return True


def _is_dead_constant(op: ir.Operation) -> bool:
    """A constant, a list of constants, or a pure op on constants that nothing uses."""
    if not op.results or any(True for result in op.results for _ in result.uses):
        return False
    if op.name.startswith("torch.constant.") or op.name in ("torch.vtensor.literal", "torch.prim.ListConstruct",
                                                             ASSUMED_CONSTANT):
        return True
    # `empty*` ops are never folded but are pure: once their users fold, they go too.
    return op.name.startswith("torch.aten.empty") and not op.regions


def _blocks(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            yield block


def _fold_block(folder: _Folder, block: ir.Block) -> int:
    folded = 0
    for child in list(block.operations):
        op = child.operation
        for nested in _blocks(op):
            folded += _fold_block(folder, nested)
        if _fold(folder, op):
            folded += 1
    return folded


def _erase_dead(block: ir.Block) -> None:
    # In reverse order, so that a user goes before the constants it used.
    for child in reversed(list(block.operations)):
        op = child.operation
        for nested in _blocks(op):
            _erase_dead(nested)
        if _is_dead_constant(op):
            op.erase()


@register_pass("tori-fold-constants")
def fold_constants(op: ir.Operation, pass_: object, *, limit: int = FOLD_LIMIT) -> None:
    """Evaluate torch-dialect ops on constants with PyTorch and replace them by literals.

    `limit`: the most elements one folded result may have.
    """
    folder = _Folder(op, limit)
    # The backend compiles inside Dynamo's tracing, under its FakeTensorMode: tensors
    # with real values need the dispatch modes set aside.
    with _disable_current_modes():
        folded = sum(_fold_block(folder, block) for block in _blocks(op))
    for block in _blocks(op):
        _erase_dead(block)
    log.debug("folded %d ops", folded)
