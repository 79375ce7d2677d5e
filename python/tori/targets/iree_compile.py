"""The `iree` stage: run iree-compile on a torch-dialect module for one target.

iree-compile runs as a child process, so a compiler abort or segfault becomes a
CompileError instead of taking the user's interpreter down.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from tori.errors import CompileError, UnsupportedOpError
from tori.stages import Stage
from tori.stats import counters
from tori.targets import Target, spec

# Flags every compilation gets: torch input, and float64 kept as float64 so results
# have eager's dtype (unless the target's device has no float64: see TargetSpec.float64).
BASE_FLAGS = ("--iree-input-type=torch", "--iree-input-demote-f64-to-f32=false")


@lru_cache(maxsize=1)
def iree_compile_tool() -> str:
    from iree.compiler.tools.binaries import find_tool

    return find_tool("iree-compile")


def compile_flags(target: Target, arch: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """Every iree-compile flag for `target`; `arch` is its device model (the `cpu`,
    `cuda_arch`, `vulkan_target` or `rocm_chip` option), the table's default when None."""
    base = list(BASE_FLAGS) if spec(target).float64 else [BASE_FLAGS[0], "--iree-input-demote-f64-to-f32=true"]
    return base + spec(target).compile_flags(arch) + list(extra)


@lru_cache(maxsize=1)
def compiled_in_backends() -> tuple[str, ...]:
    """The target backends this build of iree-compile has (`--iree-hal-list-target-backends`)."""
    done = subprocess.run([iree_compile_tool(), "--iree-hal-list-target-backends"], capture_output=True, text=True,
                          timeout=60)
    lines = done.stdout.splitlines()
    return tuple(line.strip() for line in lines[1:] if line.strip()) if done.returncode == 0 else ()


@dataclass(frozen=True)
class IreeInvocation:
    """One iree-compile command: flags and the input it reads."""

    flags: tuple[str, ...]

    def command(self, input_path: str = "-", output_path: str = "-") -> list[str]:
        return [iree_compile_tool(), input_path, *self.flags, "-o", output_path]

    def shell_command(self, input_path: str, output_path: str = "module.vmfb") -> str:
        return shlex.join(["iree-compile", input_path, *self.flags, "-o", output_path])


_OP_PATTERNS = (
    # An op Torch-MLIR knows no definition of is imported as a generic torch.operator.
    re.compile(r'"torch\.operator"[^\n]*?name = "([\w.]+)"'),
    re.compile(r"failed to legalize operation '([\w.]+)'"),
    re.compile(r"failed to legalize unresolved materialization.*?'([\w.]+)'"),
    re.compile(r"unsupported by backend.*?'([\w.]+)'"),
    re.compile(r"'([\w.]+)' op"),
)
_LOC_PATTERN = re.compile(r"^(\S+:\d+:\d+): error:", re.MULTILINE)


def summarize_diagnostics(stderr: str) -> tuple[str, str | None, str | None]:
    """The first error line, the op it names and its MLIR location, from iree-compile's stderr."""
    error_lines = [line for line in stderr.splitlines() if "error:" in line]
    first = error_lines[0].split("error:", 1)[1].strip() if error_lines else stderr.strip()[-2000:]
    op = None
    for pattern in _OP_PATTERNS:
        match = pattern.search(stderr)
        if match:
            op = match.group(1)
            break
    loc_match = _LOC_PATTERN.search(stderr)
    return first or "iree-compile failed", op, loc_match.group(1) if loc_match else None


def run_iree_compile(bytecode: bytes, invocation: IreeInvocation, *, graph: str, timeout_s: float) -> bytes:
    """Compile MLIR bytecode to a vmfb; raise CompileError (stage 'iree') on any failure."""
    counters.iree_compiles += 1
    try:
        done = subprocess.run(invocation.command(), input=bytecode, capture_output=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise CompileError(f"iree-compile did not finish within {timeout_s:g} s (killed)", stage=Stage.IREE.value, graph=graph) from None
    if done.returncode != 0:
        stderr = done.stderr.decode(errors="replace")
        reason, op, loc = summarize_diagnostics(stderr)
        if done.returncode < 0:
            reason = f"iree-compile crashed with signal {-done.returncode}: {reason}"
        error_cls = UnsupportedOpError if op and "legalize" in stderr else CompileError
        raise error_cls(reason, stage=Stage.IREE.value, graph=graph, op=op, location=loc)
    return done.stdout
