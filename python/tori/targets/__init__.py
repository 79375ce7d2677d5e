"""IREE targets: which HAL device a module is compiled for and the flags that say so."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Target(str, enum.Enum):
    CPU = "cpu"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TargetSpec:
    """How to compile for a target and which runtime drivers can run the result."""

    target: Target
    hal_device: str
    drivers: tuple[str, ...]

    def compile_flags(self, cpu: str) -> list[str]:
        flags = [f"--iree-hal-target-device={self.hal_device}"]
        if self.target is Target.CPU:
            flags.append(f"--iree-llvmcpu-target-cpu={cpu}")
        return flags


SPECS: dict[Target, TargetSpec] = {
    Target.CPU: TargetSpec(Target.CPU, hal_device="local", drivers=("local-sync", "local-task")),
}


def spec(target: Target) -> TargetSpec:
    return SPECS[target]
