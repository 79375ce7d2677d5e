"""The `iree` stage: run iree-compile on a torch-dialect module for one target.

iree-compile runs as a child process, so a compiler abort or segfault becomes a
CompileError instead of taking the user's interpreter down.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import threading
import time
from collections import Counter
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


# The same diagnostic line this many times means a lowering retrying without end (a
# softmax over a 0-d tensor printed "failed to get softmax result" 8 million times in
# 90 s); one op per line of a large module repeats far less. Only this much of
# stderr is kept for the error.
REPEAT_LIMIT = 500
_STDERR_KEPT = 256 * 1024
_DIAGNOSTIC = re.compile(r"\b(error|warning|remark):")


class _Stderr:
    """iree-compile's stderr read by a thread as it comes: the first part kept, and the
    first diagnostic line seen REPEAT_LIMIT times."""

    def __init__(self, stream):
        self.kept = bytearray()
        self.repeated: str | None = None
        self._counts: Counter = Counter()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            if len(self.kept) < _STDERR_KEPT:
                self.kept += line[:_STDERR_KEPT - len(self.kept)]
            text = line.decode(errors="replace").strip()
            if self.repeated is None and _DIAGNOSTIC.search(text):
                self._counts[text] += 1
                if self._counts[text] >= REPEAT_LIMIT:
                    self.repeated = text
        stream.close()

    def text(self) -> str:
        self._thread.join(timeout=5)
        return self.kept.decode(errors="replace")


def _drain(stream, into: list[bytes]) -> threading.Thread:
    def read() -> None:
        into.append(stream.read())
        stream.close()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def _feed(stream, data: bytes) -> threading.Thread:
    def write() -> None:
        try:
            stream.write(data)
            stream.close()
        except (BrokenPipeError, OSError):  # the child exited (or was killed) first
            pass

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


def run_iree_compile(bytecode: bytes, invocation: IreeInvocation, *, graph: str, timeout_s: float) -> bytes:
    """Compile MLIR bytecode to a vmfb; raise CompileError (stage 'iree') on any failure,
    a compile past `timeout_s` or one repeating a diagnostic without end included (the
    child is killed at once)."""
    counters.iree_compiles += 1
    started = time.monotonic()
    process = subprocess.Popen(invocation.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    stdout: list[bytes] = []
    feeder, reader, stderr = _feed(process.stdin, bytecode), _drain(process.stdout, stdout), _Stderr(process.stderr)
    killed = None
    while process.poll() is None:
        elapsed = time.monotonic() - started
        if stderr.repeated is not None:
            killed = (f"iree-compile repeated the diagnostic {stderr.repeated[:300]!r} {REPEAT_LIMIT} times in "
                      f"{elapsed:.1f} s (a lowering retrying without end; killed)")
        elif elapsed > timeout_s:
            killed = f"iree-compile did not finish within {timeout_s:g} s (killed)"
        if killed:
            process.kill()
            process.wait()
            break
        try:
            process.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            pass
    feeder.join(timeout=5)
    reader.join(timeout=60)
    text = stderr.text()
    if killed:
        _, op, loc = summarize_diagnostics(text)
        raise CompileError(killed, stage=Stage.IREE.value, graph=graph, op=op, location=loc)
    if process.returncode != 0:
        reason, op, loc = summarize_diagnostics(text)
        if process.returncode < 0:
            reason = f"iree-compile crashed with signal {-process.returncode}: {reason}"
        error_cls = UnsupportedOpError if op and "legalize" in text else CompileError
        raise error_cls(reason, stage=Stage.IREE.value, graph=graph, op=op, location=loc)
    return stdout[0] if stdout else b""
