"""CUDA's device target, including architectures IREE 3.13 cannot describe itself.

IREE compiles for an SM architecture only when its table of known GPUs describes
it (`#iree_gpu.target`: MMA intrinsics, subgroup size, workgroup limits). Version
3.13 has entries for sm_60..sm_89 and sm_120, none for sm_90/sm_90a (Hopper) or
sm_100 (Blackwell datacenter): its CUDA target then carries no description and
kernel configuration stops with "missing GPU target in #hal.executable.target".

`--iree-hal-target-device` also takes a whole `#hal.device.target` attribute. For
an architecture IREE does not describe, tori asks IREE for the description of
the nearest architecture it does (sm_89, whose mma.sync and WMMA intrinsics
Hopper and Blackwell also execute) and names the requested architecture in it,
so LLVM's NVPTX backend emits PTX for that SM (`.target sm_90`).
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from tori.errors import OptionsError

# The architecture whose description stands in for one IREE lacks.
DESCRIBED_BASE = "sm_89"

# Names iree-compile accepts for --iree-cuda-target besides sm_NN (a sample, for messages).
EXAMPLES = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120", "ampere", "ada", "a100", "rtx4090")

_PROBE = """
func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %a, %a : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""
_DEVICE_TARGET = re.compile(r"(#hal\.device\.target<\"cuda\".*?>) : !hal\.device")


@lru_cache(maxsize=None)
def _described_device_target(arch: str) -> str | None:
    """IREE's `#hal.device.target` for `arch`, or None when IREE has no description of it."""
    from tori.targets.iree_compile import iree_compile_tool

    with tempfile.TemporaryDirectory(prefix="tori-cuda-") as tmp:
        source = Path(tmp) / "probe.mlir"
        source.write_text(_PROBE)
        done = subprocess.run(
            [iree_compile_tool(), str(source), "--iree-hal-target-device=cuda", f"--iree-cuda-target={arch}",
             "--compile-to=executable-sources"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        reason = next((line.split("error:", 1)[1].strip() for line in done.stderr.splitlines() if "error:" in line),
                      done.stderr.strip()[-300:])
        raise OptionsError("cuda_arch", arch, EXAMPLES, message=f"iree-compile rejects cuda_arch {arch!r}: {reason}; "
                           f"examples of valid values: {', '.join(EXAMPLES)}")
    match = _DEVICE_TARGET.search(done.stdout)
    if match is None:
        raise OptionsError("cuda_arch", arch, EXAMPLES,
                           message=f"iree-compile printed no CUDA device target for {arch!r}")
    attribute = match.group(1)
    return attribute if "iree_codegen.target_info" in attribute else None


@lru_cache(maxsize=None)
def device_target(arch: str) -> tuple[str, bool]:
    """The `#hal.device.target` attribute for `arch`, and whether tori derived it
    (True: IREE lacks a description of `arch`; sm_89's stands in)."""
    described = _described_device_target(arch)
    if described is not None:
        return described, False
    base = _described_device_target(DESCRIBED_BASE)
    resolved = re.search(r'arch = "([^"]+)"', base).group(1)
    return base.replace(f'arch = "{resolved}"', f'arch = "{arch}"', 1), True


def compile_flags(arch: str) -> list[str]:
    """iree-compile flags for CUDA `arch`: IREE's own when it describes the
    architecture, else the derived device target attribute."""
    attribute, derived = device_target(arch)
    if derived:
        return [f"--iree-hal-target-device={attribute}"]
    return ["--iree-hal-target-device=cuda", f"--iree-cuda-target={arch}"]
