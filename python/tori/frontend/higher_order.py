"""Higher-order ops that Torch-MLIR's FxImporter does not import itself, imported
into the `torch` stage by tori: `invoke_subgraph` (`torch.compiler.nested_compile_region`).
"""

from __future__ import annotations

import torch.fx
from torch._ops import HigherOrderOperator
from torch_mlir.dialects import func as func_d
from torch_mlir.extras.fx_importer import GraphNodeImporter
from torch_mlir.ir import Location


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
