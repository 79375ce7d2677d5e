"""Running compiled modules: the per-call path of `torch.compile` graphs, and exported
artifacts (`load`), which need only IREE's runtime and numpy: nothing here imports
PyTorch until a torch-facing module (compiled_graph, targeted, transfer) is imported.
"""

from __future__ import annotations

from typing import Any


def load(path, device: str = "cpu") -> Any:
    """An exported artifact folder, ready to call with numpy arrays (tori.runtime.artifact.load)."""
    from tori.runtime.artifact import load as load_artifact

    return load_artifact(path, device=device)


def update_parameters(path, values, *, allow_new: bool = False) -> None:
    """Replace weights in an artifact's parameter archive (tori.runtime.artifact.update_parameters)."""
    from tori.runtime.artifact import update_parameters as update

    update(path, values, allow_new=allow_new)
