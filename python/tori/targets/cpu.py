"""The CPU model tori compiles for (`cpu` option): "host" or a name LLVM knows.

iree-compile only warns about a CPU name LLVM does not know, and compiles for a
generic processor; tori asks it once per name and refuses an unknown one, listing
the names it accepts.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import threading
from concurrent.futures import Future
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
    done = _probe(name, "-o", "probe.vmfb")
    if "is not a recognized processor" in done.stderr or done.returncode != 0:
        accepted = _ACCEPTED.search(done.stderr)
        names = ["host", *(accepted.group(1).split(", ") if accepted else [])]
        raise OptionsError("cpu", name, names, unknown=True,
                           hint="'host' is the CPU compiling; a name is another machine's CPU model")
    return name


_FEATURES = re.compile(r'cpu_features = "([^"]*)"')
# LLVM features with which IREE's code for 16-bit float contractions is vector code
# (x86, AArch64). F16C's conversions suffice for f16: a wide MLP in f16 ran 0.95 ms
# on Zen 5 (no AVX-512 FP16), 1.79 with its operands widened first (float32 0.60);
# bf16 without AVX-512 BF16 ran one scalar multiply-add per product (Zen 3).
_ARITHMETIC = {"bf16": ("+avx512bf16", "+amx-bf16", "+bf16"),
               "f16": ("+avx512fp16", "+amx-fp16", "+fullfp16", "+f16c")}


# CPU name -> its features, resolved or being resolved (one probe per name and process).
_RESOLVED: dict[str, Future] = {}
_RESOLVED_LOCK = threading.Lock()


def cpu_features(name: str) -> frozenset[str]:
    """The LLVM features ("+avx2", ...) of CPU `name` ("host": this machine's), as
    iree-compile resolves them for its code generation."""
    return _resolving(name).result()


def resolve_in_background(name: str) -> None:
    """Start resolving `cpu_features(name)` in a thread: the probe (an iree-compile
    process, 0.1-0.2 s) then runs while AOTAutograd traces the graph on the other core,
    and the code generation choice that asks for the features finds them ready."""
    _resolving(name)


def _resolving(name: str) -> Future:
    with _RESOLVED_LOCK:
        future = _RESOLVED.get(name)
        if future is None:
            future = _RESOLVED[name] = Future()
            threading.Thread(target=_resolve, args=(name, future), name="tori-cpu-probe", daemon=True).start()
    return future


def _resolve(name: str, future: Future) -> None:
    try:
        found = _FEATURES.search(_probe(name, "--compile-to=executable-targets").stdout)
    except BaseException as error:  # noqa: BLE001 (handed to the caller; the next call probes again)
        with _RESOLVED_LOCK:
            _RESOLVED.pop(name, None)
        future.set_exception(error)
        return
    future.set_result(frozenset(found.group(1).split(",")) if found else frozenset())


def _probe(name: str, *flags: str) -> subprocess.CompletedProcess:
    """iree-compile of a one-op function for CPU `name`, with `flags` (an output file
    named in them is written to a temporary folder)."""
    from tori.targets.iree_compile import iree_compile_tool

    with tempfile.TemporaryDirectory(prefix="tori-cpu-") as tmp:
        source = Path(tmp) / "probe.mlir"
        source.write_text(_PROBE)
        return subprocess.run(
            [iree_compile_tool(), str(source), "--iree-hal-target-device=local",
             "--iree-hal-local-target-device-backends=llvm-cpu", f"--iree-llvmcpu-target-cpu={name}",
             *(str(Path(tmp) / f) if f.endswith(".vmfb") else f for f in flags)],
            capture_output=True, text=True, timeout=120, cwd=tmp)


def float16_types_without_arithmetic(name: str) -> frozenset[str]:
    """Which of "bf16" and "f16" CPU `name` has no vector arithmetic (or conversions)
    for: IREE's matmuls of them there run one scalar multiply-add per product."""
    features = cpu_features(name)
    return frozenset(kind for kind, needed in _ARITHMETIC.items() if not features & set(needed))
