"""Counts of graphs compiled by tori and of graphs that fell back to eager PyTorch,
and of the calls each kind served: a fallback never passes for a compiled success.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Counters:
    compiled_graphs: int = 0  # AOT graphs compiled to a vmfb (by iree-compile or from the compile cache)
    fallback_graphs: int = 0  # AOT or Dynamo graphs that run in eager PyTorch instead
    compiled_calls: int = 0  # calls served by an IREE module
    fallback_calls: int = 0  # calls served by eager PyTorch after a fallback
    # Partial fallback (frontend/partition.py): AOT graphs split around ops that do not
    # compile, counted apart from whole graphs (neither compiled_graphs nor fallback_graphs).
    partitioned_graphs: int = 0  # AOT graphs that run split: compiled parts and eager ops
    compiled_parts: int = 0  # parts of partitioned graphs compiled to a vmfb
    eager_ops: int = 0  # ops of partitioned graphs that run in eager PyTorch
    partitioned_calls: int = 0  # calls served by a partitioned graph (its parts count compiled_calls)
    shape_variants: int = 0  # static-shape variants compiled for graphs with dynamic shapes
    iree_compiles: int = 0  # iree-compile runs (a compile cache hit makes none)
    cache_hits: int = 0  # graphs whose modules came from the compile cache
    cache_misses: int = 0  # graphs looked up in the compile cache and not found
    cache_corrupt: int = 0  # cache entries that failed their content hash (deleted)
    cache_refused: int = 0  # shared cache entries not signed with TORI_CACHE_KEY
    cache_waits: int = 0  # cache hits on modules another process compiled while this one waited for them
    # Dynamo graphs served from the compile cache before AOTAutograd traced them (frontend/graph_cache.py)
    graph_cache_hits: int = 0

    def snapshot(self) -> "Counters":
        return Counters(**{f.name: getattr(self, f.name) for f in fields(self)})

    def since(self, earlier: "Counters") -> "Counters":
        return Counters(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})

    def clear(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


counters = Counters()
