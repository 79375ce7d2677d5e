"""IREE targets: which HAL device a module is compiled for, the flags that say so,
and which runtime drivers can run the result. One table, `SPECS`, holds them all.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Target(str, enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    VULKAN = "vulkan"
    ROCM = "rocm"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class TargetSpec:
    """How to compile for a target and which runtime drivers can run the result.

    `arch_option` names the tori option that picks the device model (an LLVM CPU
    name, a CUDA SM architecture, a Vulkan target environment, a ROCm chip);
    `arch_flag` is the iree-compile flag it becomes.
    """

    target: Target
    hal_device: str          # --iree-hal-target-device
    backend: str             # IREE's compiler target backend (--iree-hal-list-target-backends)
    drivers: tuple[str, ...]  # IREE runtime drivers, the preferred first
    arch_option: str
    arch_flag: str
    default_arch: str
    executable_format: str   # prefix of the executable format IREE writes into the vmfb
    host_memory: bool        # the device reads and writes host memory in place (torch CPU tensors)
    # Whether float64 is kept. Where not, float64 is demoted to float32 and results are
    # converted back: Vulkan's portable baseline has no float64, and IREE 3.13's CUDA
    # codegen fails ("failed to distribute") on float64 scalars in attention.
    float64: bool = True
    # The driver of a graph's calls before its drivers are timed (the first call; calls
    # while weights' pages collapse): the one whose threads give one call of real
    # compute its shortest time. None: the first of `drivers`.
    first_calls_driver: str | None = None

    def compile_flags(self, arch: str | None = None) -> list[str]:
        arch = arch or self.default_arch
        if self.target is Target.CUDA:
            from tori.targets import cuda

            return cuda.compile_flags(arch)
        if self.target is Target.VULKAN:
            from tori.targets import vulkan

            arch = vulkan.resolve(arch)
        flags = [f"--iree-hal-target-device={self.hal_device}"]
        if self.target is Target.CPU:
            flags.append(f"--iree-hal-local-target-device-backends={self.backend}")
        if arch:
            flags.append(f"{self.arch_flag}={arch}")
        return flags


SPECS: dict[Target, TargetSpec] = {
    Target.CPU: TargetSpec(
        Target.CPU, hal_device="local", backend="llvm-cpu", drivers=("local-sync", "local-task"),
        arch_option="cpu", arch_flag="--iree-llvmcpu-target-cpu", default_arch="host",
        executable_format="embedded-elf", host_memory=True, first_calls_driver="local-task"),
    Target.CUDA: TargetSpec(
        # sm_80 PTX: the CUDA driver JIT-compiles it for any newer GPU (docs/targets.md).
        Target.CUDA, hal_device="cuda", backend="cuda", drivers=("cuda",),
        arch_option="cuda_arch", arch_flag="--iree-cuda-target", default_arch="sm_80",
        executable_format="cuda-nvptx-fb", host_memory=False, float64=False),
    Target.VULKAN: TargetSpec(
        # "host": this machine's Vulkan device, lavapipe's own IREE target (`llvmpipe`) when it is
        # lavapipe, else IREE's most portable environment, vp_android_baseline_2022 (tori/targets/vulkan.py).
        Target.VULKAN, hal_device="vulkan", backend="vulkan-spirv", drivers=("vulkan",),
        arch_option="vulkan_target", arch_flag="--iree-vulkan-target", default_arch="host",
        executable_format="vulkan-spirv-fb", host_memory=False, float64=False),
    Target.ROCM: TargetSpec(
        Target.ROCM, hal_device="hip", backend="rocm", drivers=("hip",),
        arch_option="rocm_chip", arch_flag="--iree-rocm-target", default_arch="gfx942",
        executable_format="rocm-hsaco-fb", host_memory=False),
}


def spec(target: Target) -> TargetSpec:
    return SPECS[target]


def arch_options() -> dict[str, Target]:
    """The per-target option names (`cuda_arch`, ...) and the target each applies to."""
    return {s.arch_option: t for t, s in SPECS.items()}
