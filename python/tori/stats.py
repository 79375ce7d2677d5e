"""Counts of graphs compiled by tori and of graphs that fell back to eager PyTorch,
and of the calls each kind served: a fallback never passes for a compiled success.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class Counters:
    compiled_graphs: int = 0  # AOT graphs compiled to a vmfb
    fallback_graphs: int = 0  # AOT or Dynamo graphs that run in eager PyTorch instead
    compiled_calls: int = 0  # calls served by an IREE module
    fallback_calls: int = 0  # calls served by eager PyTorch after a fallback
    shape_variants: int = 0  # static-shape variants compiled for graphs with dynamic shapes

    def snapshot(self) -> "Counters":
        return Counters(**{f.name: getattr(self, f.name) for f in fields(self)})

    def since(self, earlier: "Counters") -> "Counters":
        return Counters(**{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)})

    def clear(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)


counters = Counters()
