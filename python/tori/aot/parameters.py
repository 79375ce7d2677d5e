"""Weights outside the module: FxImporter hooks that turn parameters and buffers into
IREE globals initialised from a parameter archive, `#stream.parameter.named<"model"::NAME>`,
so that new weights need a new .irpa, not a recompile.

Each weight becomes
    util.global private @NAME = #stream.parameter.named<"model"::"NAME"> : tensor<...>
read where the graph used it by `util.global.load` and `torch_c.from_builtin_tensor`;
IREE's dialects are not registered in torch-mlir's context, so the ops are built
generically and the module reaches iree-compile as text.
"""

from __future__ import annotations

import torch
from torch_mlir import ir
from torch_mlir.extras.fx_importer import FxImporterHooks

from tori.runtime.artifact import PARAMETER_SCOPE

# Element types of the builtin tensors that hold each externalised dtype; weights of
# other dtypes stay in the module.
BUILTIN_ELEMENT = {
    torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "i8",
}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class ExternalParameters(FxImporterHooks):
    """Resolves the tensors registered with `add` as parameter loads; every other literal
    is imported as usual (inline)."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self.tensors: dict[str, torch.Tensor] = {}  # name -> value, in first-use order
        self._declared: set[str] = set()

    def add(self, tensor: torch.Tensor, name: str) -> bool:
        """Externalise `tensor` as parameter `name`; False when its dtype stays inline."""
        if tensor.dtype not in BUILTIN_ELEMENT:
            return False
        self._names[id(tensor)] = name
        self.tensors.setdefault(name, tensor)
        return True

    def resolve_literal(self, gni, literal, info):
        name = self._names.get(id(literal))
        if name is None:
            return None
        context = gni._c
        element = BUILTIN_ELEMENT[literal.dtype]
        builtin = ir.RankedTensorType.parse(f"tensor<{''.join(f'{d}x' for d in literal.shape)}{element}>", context)
        module = gni.fx_importer._m
        if name not in self._declared:
            self._declared.add(name)
            with ir.InsertionPoint.at_block_begin(module.body), ir.Location.unknown(context):
                ir.Operation.create("util.global", attributes={
                    "sym_name": ir.StringAttr.get(name, context),
                    "sym_visibility": ir.StringAttr.get("private", context),
                    "type": ir.TypeAttr.get(builtin),
                    "initial_value": ir.Attribute.parse(
                        f'#stream.parameter.named<"{PARAMETER_SCOPE}"::"{name}"> : {builtin}', context),
                })
        load = ir.Operation.create("util.global.load", results=[builtin],
                                   attributes={"global": ir.FlatSymbolRefAttr.get(name, context)}).result
        vtensor = gni._cc.tensor_to_vtensor_type(literal)
        return ir.Operation.create("torch_c.from_builtin_tensor", results=[vtensor], operands=[load]).result
