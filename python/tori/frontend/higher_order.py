"""Higher-order ops that Torch-MLIR's FxImporter does not import itself, imported
into the `torch` stage by tori: `invoke_subgraph` (`torch.compiler.nested_compile_region`),
and `with_effects` around linalg's error check (`torch.linalg.inv`, `cholesky`, `solve`);
and the checks FxImporter would drop, `_assert_async` (`torch._assert_async`, tori's
index bounds checks) and linalg's error check, as `torch.runtime.assert`, which IREE's
runtime evaluates on every call.
"""

from __future__ import annotations

import torch
import torch.fx
from torch._ops import HigherOrderOperator
from torch_mlir.dialects import func as func_d
from torch_mlir.extras.fx_importer import GraphNodeImporter, _make_constant_op
from torch_mlir.ir import Location, Operation, StringAttr

_LINALG_CHECK_ERRORS = torch.ops.aten._linalg_check_errors.default
_ASSERT_ASYNC = (torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default)
# eager's message for `torch._assert_async(t)` without one.
_ASSERT_ASYNC_MESSAGE = "Expected Tensor with single nonzero value, but got zero"
# AOTAutograd's in-graph effect tokens (tori's backend sets `unlift_effect_tokens`).
_TOKEN_OPS = (torch.ops.prims._make_token.default, torch.ops.prims._sink_tokens.default)


class NodeImporter(GraphNodeImporter):
    """FxImporter's node importer (`graph_node_importer_cls`), extended with the
    `_import_hop_<name>` handlers that FxImporter dispatches higher-order ops to."""

    __slots__ = ()

    def _import_hop_invoke_subgraph(self, loc: Location, node: torch.fx.Node, hop: HigherOrderOperator) -> None:
        """`invoke_subgraph(subgraph, identifier, *operands)` as a `func.call` of one
        private function per subgraph: a region used N times is one body and N calls."""
        subgraph_node, identifier, *operands = node.args
        subgraph = getattr(node.graph.owning_module, subgraph_node.target)
        callee = self._subgraph_function(subgraph, identifier or subgraph_node.target)
        call = func_d.CallOp(callee, [self._import_argument(loc, operand) for operand in operands], loc=loc)
        # The subgraph returns a tuple, which the call returns as separate results
        # that FxImporter's getitem handling picks by index.
        if isinstance(node.meta["val"], (list, tuple)):
            self._multi_result_nodes.add(node)
        for index, value in enumerate(call.results):
            self.bind_node_value(node, value, index)

    def _import_hop_with_effects(self, loc: Location, node: torch.fx.Node, hop: HigherOrderOperator) -> None:
        """`with_effects(token, aten._linalg_check_errors, info, api_name, is_matrix=...)`:
        what AOTAutograd makes of the error check of `torch.linalg.inv`, `cholesky`,
        `solve`, `lu_factor` (an ordered effect). Imported as a `torch.runtime.assert`
        that every `info` is 0, which IREE's runtime checks on each call (the call fails
        where eager raises LinAlgError)."""
        token, op, *args = node.args
        if op is not _LINALG_CHECK_ERRORS:
            raise NotImplementedError(
                f"Higher-order operation 'with_effects' of {op} not implemented in the FxImporter "
                "(tori imports it around aten._linalg_check_errors only)")
        self._check_linalg_errors(loc, *args)
        self._multi_result_nodes.add(node)
        # The token, which only `_sink_tokens` takes: a placeholder value.
        token = Operation.create("torch.constant.none", results=[self._cc.torch_none_type], loc=loc).result
        self.bind_node_value(node, token, 0)

    def _import_torch_op_overload(self, loc: Location, node: torch.fx.Node, concrete_target=None) -> None:
        target = concrete_target or node.target
        if target in _TOKEN_OPS:
            return  # effect tokens order effects in FX; MLIR's side-effecting ops keep their order
        if target is _LINALG_CHECK_ERRORS:  # outside `with_effects`, as a tori decomposition emits it
            self._check_linalg_errors(loc, *node.args)
            return
        if target in _ASSERT_ASYNC:  # `torch._assert_async(condition, message)`
            condition, message = (*node.args, _ASSERT_ASYNC_MESSAGE)[:2]
            self._assert(loc, self._import_argument(loc, condition), message)
            return
        super()._import_torch_op_overload(loc, node, concrete_target)

    def _check_linalg_errors(self, loc: Location, info: torch.fx.Node, api_name: str, *unused) -> None:
        self._assert_all_zero(loc, info, f"{api_name}: the factorization could not be completed (LAPACK info != 0): "
                                         "the input is singular or not positive-definite")

    def _assert_all_zero(self, loc: Location, tensor: torch.fx.Node, message: str) -> None:
        cc = self._cc
        value = self._import_argument(loc, tensor)
        shape = tensor.meta["val"].shape
        with loc:
            zero = _make_constant_op("torch.constant.int", cc.integer_attr(0, 64), cc.torch_int_type)
        ok = Operation.create("torch.aten.eq.Scalar", results=[cc.get_vtensor_type(shape, torch.bool)],
                              operands=[value, zero.result], loc=loc).result
        if len(shape):
            ok = Operation.create("torch.aten.all", results=[cc.get_vtensor_type(torch.Size([]), torch.bool)],
                                  operands=[ok], loc=loc).result
        self._assert(loc, ok, message)

    def _assert(self, loc: Location, condition, message: str) -> None:
        """Fail the call with `message` where the one-element tensor `condition` is zero."""
        flag = Operation.create("torch.aten.Bool.Tensor", results=[self._cc.torch_bool_type], operands=[condition],
                                loc=loc).result
        Operation.create("torch.runtime.assert", attributes={"message": StringAttr.get(message)},
                         operands=[flag], loc=loc)

    def _subgraph_function(self, subgraph: torch.fx.GraphModule, name: str) -> func_d.FuncOp:
        """The private function holding `subgraph`, imported at its first use.

        Keyed by the subgraph module, which every use of a region shares, in the map
        FxImporter keeps for its own higher-order ops (`while_loop`).
        """
        importer = self.fx_importer
        functions = importer._graph_module_to_func_name
        if id(subgraph) not in functions:
            func = importer.import_stateless_graph(subgraph.graph, func_name=name, func_visibility="private")
            # The symbol table renames a function whose name is taken.
            functions[id(subgraph)] = func.attributes["sym_name"].value
        return importer.symbol_table[functions[id(subgraph)]]
