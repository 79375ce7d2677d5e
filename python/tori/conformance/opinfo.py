"""One OpInfo entry of PyTorch's op database, compiled by tori and compared with eager.

Each op's first samples (sample inputs of the OpInfo, for one dtype) are applied in
one function, compiled with `fullgraph=True` and `fallback="error"`, so only native
compilation counts: the outcome is a pass only when at least one graph compiled, no
graph fell back, every call ran on IREE, and every output (and every input the op
mutates) matches eager PyTorch within the OpInfo's tolerances with the exact dtype.
"""

from __future__ import annotations

import enum
import functools
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable

import torch
import torch.utils._pytree as pytree

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}

# assert_close's defaults, and the floor tori compares float32 with: IREE evaluates
# transcendental functions with polynomial approximations (as TorchInductor's vectorized
# code does), a few ulp from glibc's results that eager uses.
_DEFAULT_TOLERANCE = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5),
                      torch.float64: (1e-7, 1e-7)}
_FLOOR = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2),
          torch.float64: (1e-7, 1e-7)}


# The ways an op is checked: tori with fallback 'error' (the conformance figure and the
# expected-failures list), tori with its default fallback, and TorchInductor for comparison.
MODES = {"tori": ("tori", {"fallback": "error"}), "tori-fallback": ("tori", {}), "inductor": ("inductor", None)}


class Status(str, enum.Enum):
    PASS = "pass"
    FAIL = "fail"
    SKIP = "skip"  # eager PyTorch itself cannot run the samples: not counted


class Kind(str, enum.Enum):
    """Why an op failed (or was skipped)."""

    NONE = ""
    EAGER = "eager"  # eager raised on the samples (skip)
    NO_SAMPLES = "no-samples"  # the OpInfo has no sample for the dtype (skip)
    DYNAMO = "dynamo"  # TorchDynamo could not capture one graph (fullgraph)
    COMPILE = "compile"  # tori raised CompileError (import, passes, iree-compile)
    RUNTIME = "runtime"  # IREE's runtime refused a call
    NOT_COMPILED = "not-compiled"  # no graph compiled, or a call ran outside IREE
    MISMATCH = "mismatch"  # a value differs from eager's
    DTYPE = "dtype"  # an output's dtype or shape differs from eager's
    CRASH = "crash"  # the worker process died (set by the runner)
    TIMEOUT = "timeout"  # the worker took too long (set by the runner)


@dataclass
class Outcome:
    op: str
    dtype: str
    status: Status
    kind: Kind = Kind.NONE
    detail: str = ""
    samples: int = 0
    seconds: float = 0.0
    mode: str = "tori"  # how it was compiled: see MODES
    ran: str = ""  # for a pass with fallback: 'compiled', 'partly eager' or 'eager'

    def to_json(self) -> dict:
        data = asdict(self)
        data["status"], data["kind"] = self.status.value, self.kind.value
        return data

    @classmethod
    def from_json(cls, data: dict) -> "Outcome":
        return cls(**{**data, "status": Status(data["status"]), "kind": Kind(data["kind"])})


def op_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _call_unseeded(op: Callable, *args, **kwargs):
    return op(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def op_database() -> dict[str, Any]:
    """PyTorch's OpInfo entries by name (`name.variant`); needs the expecttest package.

    The random ops' entries call them inside `wrapper_set_seed`, which saves and
    restores the generator's state (not traceable by Dynamo); here they are called
    directly, as TorchInductor's OpInfo tests do, and compared by shape and dtype.
    """
    from torch.testing._internal import common_methods_invocations

    common_methods_invocations.wrapper_set_seed = _call_unseeded
    return {op_name(op): op for op in common_methods_invocations.op_db}


def ops_for(dtype: torch.dtype) -> list[str]:
    """The names of the OpInfo entries that declare `dtype` on the CPU."""
    return [name for name, op in op_database().items() if op.supports_dtype(dtype, "cpu")]


def tolerance(op, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol): the larger of the OpInfo's own tolerance overrides for `dtype`
    and tori's floor."""
    from torch.testing._internal.common_device_type import toleranceOverride

    rtol, atol = _DEFAULT_TOLERANCE[dtype]
    floor_rtol, floor_atol = _FLOOR[dtype]
    rtol, atol = max(rtol, floor_rtol), max(atol, floor_atol)
    for decorate in op.decorators:
        for decorator in getattr(decorate, "decorators", [decorate]):
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                override = decorator.d[dtype]
                rtol, atol = max(rtol, override.rtol), max(atol, override.atol)
    return rtol, atol


def _samples(op, dtype: torch.dtype, limit: int) -> list:
    samples = []
    for sample in op.sample_inputs("cpu", dtype, requires_grad=False):
        samples.append(sample)
        if len(samples) == limit:
            break
    return samples


def _split(samples: list) -> tuple[list[torch.Tensor], Callable[[list[torch.Tensor]], list]]:
    """The tensors of `samples` (the compiled function's inputs) and how to put the
    samples back together from them; everything else stays a constant."""
    leaves, spec = pytree.tree_flatten([(s.input, s.args, s.kwargs) for s in samples])
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    def rebuild(tensors: list[torch.Tensor]) -> list:
        filled = list(leaves)
        for position, tensor in zip(positions, tensors):
            filled[position] = tensor
        return pytree.tree_unflatten(filled, spec)

    return [leaves[i] for i in positions], rebuild


def _clone(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone() for t in tensors]


def _compare(actual: Any, expected: Any, *, rtol: float, atol: float, values: bool, what: str) -> tuple[Kind, str]:
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    if actual_spec != expected_spec:
        return Kind.DTYPE, f"{what}: structure {actual_spec} differs from eager's {expected_spec}"
    for index, (a, e) in enumerate(zip(actual_leaves, expected_leaves)):
        where = f"{what}[{index}]"
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                return Kind.DTYPE, f"{where}: {type(a).__name__} where eager gives a tensor"
            if a.dtype != e.dtype or a.shape != e.shape:
                return Kind.DTYPE, f"{where}: {a.dtype}{list(a.shape)} where eager gives {e.dtype}{list(e.shape)}"
            if not values:
                continue
            try:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
            except AssertionError as error:
                return Kind.MISMATCH, f"{where}: {' '.join(str(error).split())[:400]}"
        elif values and a != e and not (isinstance(e, float) and e != e and a != a):
            return Kind.MISMATCH, f"{where}: {a!r} where eager gives {e!r}"
    return Kind.NONE, ""


def _deterministic(run: Callable[[], Any]) -> bool:
    """Whether two eager runs agree exactly (random ops and uninitialized memory do not)."""
    first, second = run(), run()
    kind, _ = _compare(first, second, rtol=0, atol=0, values=True, what="eager")
    return kind is Kind.NONE


def check_op(name: str, dtype_name: str, *, samples: int = 3, mode: str = "tori") -> Outcome:
    """Compile the OpInfo `name` on its first `samples` samples for `dtype_name` (as
    `mode` says, one of MODES) and compare with eager; never raises for a failure of
    the op."""
    import time

    import torch._dynamo

    from tori.errors import CompileError, ToriRuntimeError
    from tori.testing import count_graphs

    start = time.perf_counter()
    op = op_database()[name]
    dtype = DTYPES[dtype_name]

    def outcome(status: Status, kind: Kind = Kind.NONE, detail: str = "", count: int = 0) -> Outcome:
        return Outcome(name, dtype_name, status, kind, detail, count, round(time.perf_counter() - start, 3), mode)

    torch.manual_seed(0)
    try:
        chosen = _samples(op, dtype, samples)
    except Exception as error:  # the OpInfo's own sample generator
        return outcome(Status.SKIP, Kind.EAGER, f"sample inputs: {type(error).__name__}: {error}")
    if not chosen:
        return outcome(Status.SKIP, Kind.NO_SAMPLES, "no sample inputs")
    tensors, rebuild = _split(chosen)

    def apply(*inputs: torch.Tensor):
        return tuple(op(sample_input, *args, **kwargs) for sample_input, args, kwargs in rebuild(list(inputs)))

    def eager_run():
        inputs = _clone(tensors)
        return apply(*inputs), inputs

    try:
        expected, eager_inputs = eager_run()
        values = not getattr(op, "skip_correctness_check_compile_vs_eager", False) and _deterministic(eager_run)
    except Exception as error:
        return outcome(Status.SKIP, Kind.EAGER, f"eager: {type(error).__name__}: {error}", len(chosen))

    backend, options = MODES[mode]
    torch._dynamo.reset()
    compiled = torch.compile(apply, backend=backend, fullgraph=True, dynamic=False, options=options)
    inputs = _clone(tensors)
    try:
        with count_graphs() as count:
            actual = compiled(*inputs)
    except CompileError as error:
        where = f"stage {error.stage}" + (f", op {error.op}" if error.op else "")
        return outcome(Status.FAIL, Kind.COMPILE, f"{where}: {error.reason.splitlines()[0] if error.reason else error}",
                       len(chosen))
    except ToriRuntimeError as error:
        return outcome(Status.FAIL, Kind.RUNTIME, str(error).splitlines()[0], len(chosen))
    except Exception as error:
        inner = getattr(error, "inner_exception", None)
        if isinstance(inner, CompileError):
            return outcome(Status.FAIL, Kind.COMPILE, str(inner).splitlines()[0], len(chosen))
        frames = traceback.extract_tb(error.__traceback__)
        in_dynamo = any("/torch/_dynamo/" in frame.filename for frame in frames)
        kind = Kind.DYNAMO if in_dynamo else Kind.COMPILE
        return outcome(Status.FAIL, kind, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500],
                       len(chosen))
    finally:
        torch._dynamo.reset()
    native = count.compiled_graphs >= 1 and count.compiled_calls >= 1 and not (count.fallback_graphs or count.fallback_calls)
    if mode == "tori" and not native:
        return outcome(Status.FAIL, Kind.NOT_COMPILED,
                       f"compiled graphs {count.compiled_graphs}, compiled calls {count.compiled_calls}, "
                       f"fallback graphs {count.fallback_graphs}", len(chosen))
    rtol, atol = tolerance(op, dtype)
    for what, got, want in (("output", actual, expected), ("mutated input", inputs, eager_inputs)):
        kind, detail = _compare(got, want, rtol=rtol, atol=atol, values=values, what=what)
        if kind is not Kind.NONE:
            return outcome(Status.FAIL, kind, detail, len(chosen))
    passed = outcome(Status.PASS, count=len(chosen))
    if mode == "tori-fallback":
        passed.ran = "compiled" if native else ("eager" if count.compiled_calls == 0 else "partly eager")
    return passed
