"""The `iree` stage: run iree-compile on a torch-dialect module for one target.

iree-compile runs as a child process, so a compiler abort or segfault becomes a
CompileError instead of taking the user's interpreter down.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from tori.errors import CompileError, UnsupportedOpError
from tori.stages import Stage
from tori.stats import counters
from tori.targets import Target, executable_groups, spec

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


# iree-compile verifies the whole module after every pass, which took 43% of a large
# module's compile (RegNetY-1.6GF at 8 images, 414 executables: 32.8 s, 18.6 without).
# tori runs it as three processes in a pipe instead, each verifying the module it reads
# as it parses it: the input conversion (Torch-MLIR's lowerings to linalg) verified
# after every pass, then everything up to each executable's code generation
# configuration, then code generation. An invalid op made on the way is still an error
# (IREE's data tiling of an attention block made one in its configuration), reported
# where the next phase reads it; the module is the same (RegNetY's vmfb byte for byte;
# its compile 19.2 s). A user's own --verify, --compile-from or --compile-to flag makes
# it one process again, with exactly their flags.
#
# The phases hand the module on as bytecode. IREE 3.13 cannot write some modules as
# bytecode: a `dense_resource` of signed integers that the input conversion makes
# signless ("cannot serialize resource": GPT-2's folded position ids). Those go as
# text, with their locations (`text_between`), which costs more on a large module
# (RegNetY's 6 MB after the input conversion, against 126 KB of bytecode).
PHASES = (
    ("--compile-to=input",),
    ("--compile-from=input", "--compile-to=executable-configurations", "--verify=false"),
    ("--compile-from=executable-configurations", "--verify=false"),
)
_ONE_PROCESS_FLAGS = ("--verify", "--compile-to", "--compile-from")
# IREE loads a tuning spec where it configures each executable, in parallel, holding a
# lock while it parses the spec; the parse verifies the spec's sequences in parallel
# too, and a worker waiting on that picked up another executable's configuration and
# waited on the same lock for ever (iree-compile 3.13). The configuration phase of a
# run with a tuning spec runs on one thread (DeiT-small's: 1.73 -> 1.84 s).
_TUNING_SPEC_FLAG = "--iree-codegen-tuning-spec-path"
_ONE_THREAD = "--mlir-disable-threading"


# Code generation of CPU executables merged into groups (targets/executable_groups.py):
# the configuration phase hands the module on as text to the grouping program, and
# code generation runs with IREE's linking off. A user's own linking flag keeps IREE's,
# and so does a dump's eliding of large constants (the text would lose them).
_LINK_FLAG = "--iree-hal-link-executables"
_UNGROUPED_FLAGS = (_LINK_FLAG, "--mlir-elide", *_ONE_PROCESS_FLAGS)
GROUPING_FAILED = "executable groups:"  # how the grouping program's errors begin


@dataclass(frozen=True)
class IreeInvocation:
    """One iree-compile run: flags and the input it reads, as the processes of PHASES."""

    flags: tuple[str, ...]
    text_between: bool = False  # the phases hand the module on as text (see PHASES)
    groups: int = 1  # CPU executables compiled in this many groups (targets/executable_groups.py)

    def commands(self, input_path: str = "-", output_path: str = "-", tool: str | None = None) -> list[list[str]]:
        """The commands of the run, each reading the one before on its stdin."""
        tool = tool or iree_compile_tool()
        tuned = any(flag.startswith(_TUNING_SPEC_FLAG) for flag in self.flags) and _ONE_THREAD not in self.flags
        one_thread = (_ONE_THREAD,) if tuned else ()
        if any(flag.startswith(_ONE_PROCESS_FLAGS) for flag in self.flags):
            return [[tool, input_path, *self.flags, *one_thread, "-o", output_path]]
        last = len(PHASES) - 1
        as_text = ("--mlir-print-debuginfo",)
        handoff = [as_text if self.text_between else ("--emit-mlir-bytecode",)] * last
        if self.grouped:
            handoff[last - 1] = as_text  # the grouping program reads text
        commands = [[tool, input_path if i == 0 else "-", *self.flags, *phase, *(one_thread if i == 1 else ()),
                     *(("-o", output_path) if i == last else (*handoff[i], "-o", "-"))]
                    for i, phase in enumerate(PHASES)]
        if self.grouped:
            commands[last][-2:-2] = [f"{_LINK_FLAG}=false"]
            commands.insert(last, [sys.executable, executable_groups.__file__, str(self.groups)])
        return commands

    @property
    def grouped(self) -> bool:
        return self.groups > 1 and not any(flag.startswith(_UNGROUPED_FLAGS) for flag in self.flags)

    def as_text_between(self) -> "IreeInvocation | None":
        """The same run with the phases handing the module on as text; None when it
        already does, or runs as one process."""
        if self.text_between or len(self.commands(tool="iree-compile")) == 1:
            return None
        return IreeInvocation(self.flags, text_between=True, groups=self.groups)

    def linked(self) -> "IreeInvocation | None":
        """The same run with the executables linked as IREE links them; None when they are."""
        return IreeInvocation(self.flags, self.text_between) if self.grouped else None

    def shell_command(self, input_path: str, output_path: str = "module.vmfb") -> str:
        return " | ".join(shlex.join(command) for command in self.commands(input_path, output_path, "iree-compile"))


def unserializable(error: CompileError) -> bool:
    """Whether a phase failed to write the module as bytecode (see PHASES)."""
    return "cannot serialize resource" in error.reason


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


def _broken_pipe(process: subprocess.Popen, stderr: str) -> bool:
    return process.returncode == -signal.SIGPIPE or "Broken pipe" in stderr


def run_iree_compile(bytecode: bytes, invocation: IreeInvocation, *, graph: str, timeout_s: float) -> bytes:
    """Compile MLIR bytecode to a vmfb; raise CompileError (stage 'iree') on any failure,
    a compile past `timeout_s` or one repeating a diagnostic without end included (every
    child is killed at once)."""
    counters.iree_compiles += 1
    started = time.monotonic()
    processes: list[subprocess.Popen] = []
    for command in invocation.commands():
        upstream = processes[-1].stdout if processes else subprocess.PIPE
        processes.append(subprocess.Popen(command, stdin=upstream, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        if upstream is not subprocess.PIPE:
            upstream.close()  # the next process holds it: one that exits early stops the one before
    last = processes[-1]
    stdout: list[bytes] = []
    feeder, reader = _feed(processes[0].stdin, bytecode), _drain(last.stdout, stdout)
    stderrs = [_Stderr(process.stderr) for process in processes]
    killed = None
    while any(process.poll() is None for process in processes):
        elapsed = time.monotonic() - started
        repeated = next((s.repeated for s in stderrs if s.repeated is not None), None)
        if repeated is not None:
            killed = (f"iree-compile repeated the diagnostic {repeated[:300]!r} {REPEAT_LIMIT} times in "
                      f"{elapsed:.1f} s (a lowering retrying without end; killed)")
        elif elapsed > timeout_s:
            killed = f"iree-compile did not finish within {timeout_s:g} s (killed)"
        if killed:
            for process in processes:
                process.kill()
                process.wait()
            break
        try:
            next(p for p in processes if p.poll() is None).wait(timeout=0.05)
        except (subprocess.TimeoutExpired, StopIteration):
            pass
    feeder.join(timeout=5)
    reader.join(timeout=60)
    texts = [s.text() for s in stderrs]
    if killed:
        _, op, loc = summarize_diagnostics("".join(texts))
        raise CompileError(killed, stage=Stage.IREE.value, graph=graph, op=op, location=loc)
    # The first process that failed: the ones after it failed for want of its output,
    # and one before it only for the pipe it wrote to.
    failures = [(p, text) for p, text in zip(processes, texts) if p.returncode != 0]
    if failures:
        process, text = next((f for f in failures if not _broken_pipe(*f)), failures[-1])
        reason, op, loc = summarize_diagnostics(text)
        if process.returncode < 0:
            reason = f"iree-compile crashed with signal {-process.returncode}: {reason}"
        error_cls = UnsupportedOpError if op and "legalize" in text else CompileError
        raise error_cls(reason, stage=Stage.IREE.value, graph=graph, op=op, location=loc)
    return stdout[0] if stdout else b""
