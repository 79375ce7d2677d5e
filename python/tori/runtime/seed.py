"""The seed argument of a graph with random ops (ArgKind.SEED): drawn from torch's
default CPU generator on every call, so that calls differ and `torch.manual_seed`
makes compiled results reproducible, as TorchInductor's seeds do.

The per-call cost is one `random_()` into a 0-d tensor that each thread keeps with its
IREE import: 2 to 3 us, no allocation.
"""

from __future__ import annotations

import threading

import torch
from torch.utils.dlpack import to_dlpack


class SeedSource:
    """Per thread and IREE device, a 0-d int64 host tensor imported once; each call
    draws into it in place. A call's invoke waits for its results, so the next draw
    cannot change a seed that IREE is still reading."""

    __slots__ = ("_local", "_device")

    def __init__(self, device: torch.device = torch.device("cpu")):
        self._local = threading.local()
        self._device = device  # where the graph's tensors live (a GPU's seed is drawn on the CPU, then copied)

    def buffer(self, device):
        """The seed buffer imported into the IREE `device`, holding a fresh draw."""
        slots = getattr(self._local, "slots", None)
        if slots is None:
            slots = self._local.slots = {}
        slot = slots.get(id(device))
        if slot is None:
            tensor = torch.empty((), dtype=torch.int64, device=self._device)
            slot = slots[id(device)] = (tensor, device.from_dlpack_capsule(to_dlpack(tensor)), device)
        if self._device.type == "cpu":
            slot[0].random_()
        else:
            slot[0].copy_(self.draw())
        return slot[1]

    def draw(self) -> torch.Tensor:
        """A fresh seed as a new 0-d tensor (for paths that copy their inputs)."""
        return torch.empty((), dtype=torch.int64).random_()
