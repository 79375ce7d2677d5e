"""The CPU model tori compiles for (`cpu` option): "host" or a name LLVM knows.

iree-compile only warns about a CPU name LLVM does not know, and compiles for a
generic processor; tori asks it once per name and refuses an unknown one, listing
the names it accepts.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from tori.errors import OptionsError

_PROBE = "func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> { return %a : tensor<4xf32> }\n"
_ACCEPTED = re.compile(r"List of accepted CPUs: (.*)")


@lru_cache(maxsize=None)
def check_cpu(name: str) -> str:
    """`name`, when iree-compile's LLVM knows it (or it is "host"); else OptionsError."""
    if name == "host":
        return name
    from tori.targets.iree_compile import iree_compile_tool

    with tempfile.TemporaryDirectory(prefix="tori-cpu-") as tmp:
        source = Path(tmp) / "probe.mlir"
        source.write_text(_PROBE)
        done = subprocess.run(
            [iree_compile_tool(), str(source), "--iree-hal-target-device=local",
             "--iree-hal-local-target-device-backends=llvm-cpu", f"--iree-llvmcpu-target-cpu={name}",
             "-o", str(Path(tmp) / "probe.vmfb")], capture_output=True, text=True, timeout=120)
    if "is not a recognized processor" in done.stderr or done.returncode != 0:
        accepted = _ACCEPTED.search(done.stderr)
        names = ["host", *(accepted.group(1).split(", ") if accepted else [])]
        raise OptionsError("cpu", name, names, unknown=True,
                           hint="'host' is the CPU compiling; a name is another machine's CPU model")
    return name
