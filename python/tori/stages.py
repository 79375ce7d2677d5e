"""The pipeline's stages, in order, and the artifacts each compiled graph keeps.

A stage name is what a user types to ask for a dump, what a cache key and an
error message mention.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Stage(str, enum.Enum):
    DYNAMO = "dynamo"  # FX graph captured by TorchDynamo
    ATEN = "aten"  # functional ATen graph from AOTAutograd (forward or backward)
    TORCH = "torch"  # Torch-MLIR `torch` dialect, imported by FxImporter
    TORI = "tori"  # after tori's pass pipeline
    IREE = "iree"  # the iree-compile invocation for the chosen target
    VMFB = "vmfb"  # the deployable IREE module

    def __str__(self) -> str:
        return self.value

    @classmethod
    def parse(cls, name: str) -> "Stage":
        try:
            return cls(name)
        except ValueError:
            from tori.errors import OptionsError

            raise OptionsError("stage", name, [s.value for s in cls], unknown=True) from None


STAGES: tuple[Stage, ...] = tuple(Stage)


@dataclass
class StageArtifacts:
    """The artifact of every stage a graph went through, in pipeline order.

    Text stages hold str (FX code, MLIR assembly, the compile command);
    `vmfb` holds bytes.
    """

    _items: dict[Stage, str | bytes] = field(default_factory=dict)

    def __setitem__(self, stage: Stage | str, value: str | bytes) -> None:
        self._items[Stage.parse(stage) if isinstance(stage, str) else stage] = value

    def __getitem__(self, stage: Stage | str) -> str | bytes:
        key = Stage.parse(stage) if isinstance(stage, str) else stage
        if key not in self._items:
            reached = ", ".join(s.value for s in self._items) or "none"
            raise KeyError(f"stage '{key.value}' was not reached by this graph (reached: {reached})")
        return self._items[key]

    def __contains__(self, stage: object) -> bool:
        try:
            key = Stage.parse(stage) if isinstance(stage, str) else stage
        except Exception:
            return False
        return key in self._items

    def __iter__(self):
        return iter(sorted(self._items, key=STAGES.index))

    def items(self):
        return [(s, self._items[s]) for s in self]

    def __len__(self) -> int:
        return len(self._items)
