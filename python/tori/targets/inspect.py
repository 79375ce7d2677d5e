"""What a vmfb holds for each target: its HAL devices, executable formats, the
executables themselves and the GPU architecture their code is for, read with
IREE's `iree-dump-module` (run as a child process) and from the binary's bytes.

Cross-compiled modules cannot be run here; this is how they are checked.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# How each target's executables begin: IREE's flatbuffer identifiers, and ELF for the CPU.
EXECUTABLE_MAGIC = {
    "embedded-elf": b"\x7fELF",
    "cuda-nvptx-fb": b"CDA1",
    "vulkan-spirv-fb": b"VKE1",
    "rocm-hsaco-fb": b"HIP1",
}
_SPIRV_MAGIC = bytes.fromhex("03022307")  # SPIR-V's magic number, little-endian
_RODATA_HEX = re.compile(r"^vm\.rodata\[(\d+)\] = ([0-9A-F]*)", re.MULTILINE)
_RODATA_TEXT = re.compile(r"^\s+\.rodata\[\s*(\d+)\] embedded\s+\d+ bytes `([^`]*)`", re.MULTILINE)


@dataclass(frozen=True)
class ModuleContents:
    device_ids: tuple[str, ...]          # e.g. ('cuda',), ('local*',)
    formats: tuple[str, ...]             # executable formats, e.g. ('cuda-nvptx-fb',)
    executables: tuple[tuple[str, int], ...]  # (format, bytes) of each executable binary
    entry_points: tuple[str, ...]        # dispatch function names
    gpu_archs: tuple[str, ...]           # PTX `.target sm_NN` / AMDGPU `gfxNNN` found in the binaries
    spirv_modules: int                   # SPIR-V modules (Vulkan)

    def executables_of(self, fmt: str) -> list[int]:
        """Sizes of the executables whose format starts with `fmt`."""
        return [size for f, size in self.executables if f.startswith(fmt)]


@lru_cache(maxsize=1)
def dump_module_tool() -> str:
    import iree._runtime_libs

    return str(Path(iree._runtime_libs.__file__).parent / "iree-dump-module")


def inspect_vmfb(vmfb: bytes, timeout_s: float = 120.0) -> ModuleContents:
    with tempfile.NamedTemporaryFile(suffix=".vmfb") as file:
        file.write(vmfb)
        file.flush()
        done = subprocess.run([dump_module_tool(), file.name], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ValueError(f"iree-dump-module cannot read this module: {done.stderr.strip()[-500:]}")
    dump = done.stdout
    texts = dict((int(i), t) for i, t in _RODATA_TEXT.findall(dump))
    device_ids = tuple(texts[i + 1] for i, t in texts.items() if t == "hal.device.id" and i + 1 in texts)
    formats = tuple(texts[i + 1] for i, t in texts.items() if t == "hal.executable.format" and i + 1 in texts)
    executables = []
    for _, hex_data in _RODATA_HEX.findall(dump):
        head = bytes.fromhex(hex_data[:8]) if len(hex_data) >= 8 else b""
        for fmt, magic in EXECUTABLE_MAGIC.items():
            if head == magic:
                executables.append((fmt, len(hex_data) // 2))
    entry_points = tuple(t for t in texts.values() if "_dispatch_" in t)
    archs = sorted(set(m.decode() for m in re.findall(rb"\.target (sm_\w+)", vmfb))
                   | set(m.decode() for m in re.findall(rb"amdhsa-[a-z-]*(gfx[0-9]+[a-z]?)", vmfb)))
    return ModuleContents(device_ids, formats, tuple(executables), entry_points, tuple(archs),
                          vmfb.count(_SPIRV_MAGIC))
