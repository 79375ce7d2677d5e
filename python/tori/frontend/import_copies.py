"""The graph copies tori makes on the way to Torch-MLIR's importer.

The importer reads a GraphModule's graph and attributes, never its Python code, but a
`torch.fx.GraphModule` generates and compiles that code whenever it is built or its
graph changes: 40-60 ms for each copy of MobileNetV3's graph, and a graph takes up to
four copies before its import (the runtime checks taken out, the resident weights,
the computed outputs). `import_copy` builds the copy as a lazy graph module (the
class AOTAutograd's own graphs have), which generates its code the first time
something reads or calls it.
"""

from __future__ import annotations

import torch
from torch.fx._lazy_graph_module import _LazyGraphModule


def import_copy(root: torch.nn.Module, graph: torch.fx.Graph) -> torch.fx.GraphModule:
    """A GraphModule of `graph` over `root`'s attributes, its Python code generated on first use."""
    return _LazyGraphModule(root, graph)
