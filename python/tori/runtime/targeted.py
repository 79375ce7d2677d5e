"""A graph compiled for one or more targets, run where its inputs are: CUDA tensors
on IREE's cuda driver (ROCm tensors on hip), CPU tensors on the CPU, or on Vulkan
when that is the chosen target. Each target's module is loaded on first use, so a
module cross-compiled for hardware this machine lacks costs nothing until called.
"""

from __future__ import annotations

import threading

import torch

from tori.errors import ToriRuntimeError
from tori.frontend.signature import ArgKind, GraphSignature
from tori.runtime.compiled_graph import CompiledGraph
from tori.runtime.devices import available_drivers
from tori.targets import Target, spec

# Targets whose devices take CPU tensors (copied or in place), in order of preference.
_HOST_INPUT_TARGETS = (Target.CPU, Target.VULKAN)


class TargetedGraph:
    """One AOT graph's modules, a vmfb per target, and the choice among them per call."""

    _boxed_call = True

    def __init__(self, name: str, vmfbs: dict[Target, bytes], signature: GraphSignature,
                 drivers: dict[Target, tuple[str, ...]], static_args: frozenset[int] = frozenset()):
        self.name = name
        self.vmfbs = dict(vmfbs)  # the first is the chosen target's
        self.target = next(iter(vmfbs))
        self.signature = signature
        self._drivers = drivers
        self._static_args = static_args
        tensors = (ArgKind.TENSOR, ArgKind.WRITTEN_TENSOR, ArgKind.UPDATED_TENSOR)
        self._first_tensor = next((i for i, k in enumerate(signature.args) if k in tensors), None)
        self._graphs: dict[tuple[str, int | None], CompiledGraph] = {}
        self._lock = threading.Lock()

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(self.vmfbs)

    def graph_for(self, device: torch.device) -> CompiledGraph:
        """The compiled graph that runs inputs on `device`, loaded on first use."""
        key = (device.type, device.index)
        graph = self._graphs.get(key)
        if graph is None:
            with self._lock:
                graph = self._graphs.get(key)
                if graph is None:
                    target = self._target_for(device)
                    graph = CompiledGraph(self.name, self.vmfbs[target], self.signature, self._drivers[target],
                                          self._static_args, target=target,
                                          device_index=device.index if device.type == "cuda" else None)
                    self._graphs[key] = graph
        return graph

    def __call__(self, args):
        device = args[self._first_tensor].device if self._first_tensor is not None else _CPU
        graph = self._graphs.get((device.type, device.index)) or self.graph_for(device)
        return graph(args)

    def run(self, *args):
        return self(args)

    @property
    def driver(self) -> str | None:
        graphs = list(self._graphs.values())
        return graphs[0].driver if graphs else None

    def _target_for(self, device: torch.device) -> Target:
        compiled = ", ".join(t.value for t in self.vmfbs)
        if device.type == "cuda":
            wanted = Target.ROCM if torch.version.hip else Target.CUDA
            if wanted not in self.vmfbs:
                raise ToriRuntimeError(
                    f"graph '{self.name}' got inputs on {device} but was compiled for {compiled} only; compile with "
                    f"options={{'targets': [..., '{wanted.value}']}} or move the inputs to the CPU")
            return wanted
        if device.type == "cpu":
            preferred = [self.target] if self.target in _HOST_INPUT_TARGETS else []
            for target in (*preferred, *_HOST_INPUT_TARGETS):
                if target in self.vmfbs:
                    return target
            raise ToriRuntimeError(
                f"graph '{self.name}' got CPU tensors but was compiled for {compiled} only, whose devices take their "
                f"own tensors: move the inputs to the GPU, or add 'cpu' or 'vulkan' to options['targets']. "
                f"IREE drivers in this build: {', '.join(available_drivers())}")
        raise ToriRuntimeError(
            f"graph '{self.name}' got inputs on {device}; tori runs graphs on CPU, CUDA, ROCm and Vulkan devices "
            f"(compiled for: {compiled})")


_CPU = torch.device("cpu")


def drivers_for(target: Target, driver_option) -> tuple[str, ...]:
    """The drivers to try for `target`: the table's, or the one the 'driver' option names
    (a CPU driver choice applies to the CPU target only)."""
    from tori.config import Driver

    if target is Target.CPU and driver_option is not Driver.AUTO:
        return (driver_option.value,)
    return spec(target).drivers


def runtime_graph(name: str, vmfbs: dict[Target, bytes], signature: GraphSignature, options,
                  static_args: frozenset[int] = frozenset()):
    """What runs a compiled graph: a CompiledGraph for a CPU-only compile (loaded now,
    the hot path of the default), else a TargetedGraph choosing by the inputs' device."""
    drivers = {t: drivers_for(t, options.driver) for t in vmfbs}
    if list(vmfbs) == [Target.CPU]:
        return CompiledGraph(name, vmfbs[Target.CPU], signature, drivers[Target.CPU], static_args,
                             huge_pages=options.huge_pages)
    return TargetedGraph(name, vmfbs, signature, drivers, static_args)
