"""Differential check: run fuzzed programs in eager PyTorch and compiled by tori
(fallback='error', fullgraph), compare every result of the mode (modes.py: values,
gradients, dynamic shapes, export), and classify each program.

Several programs are compiled as one function; when that batch does not compile
it is halved until the failing programs are alone, and a program that disagrees
is checked alone.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from tori.errors import CompileError
from tori.fuzz.modes import Mode, call_inputs, compiled, result_names, run_program, traced_gradients
from tori.fuzz.program import Program, batch_source, build

# Tolerances per dtype; float16 results may round differently through f32 steps.
TOLERANCES = {torch.float32: (1e-4, 1e-5), torch.float16: (1e-2, 1e-3)}


class Verdict(enum.Enum):
    MATCH = "match"  # compiled, and every output equals eager's
    REFUSED = "refused"  # tori raised CompileError (an op or case it does not compile)
    WRONG = "wrong"  # compiled, and an output differs from eager's
    CRASH = "crash"  # an exception other than CompileError, or a call that did not run compiled
    INVALID = "invalid"  # eager itself raises on these inputs: not a test of tori


@dataclass
class Outcome:
    program: Program
    verdict: Verdict
    detail: str = ""


@dataclass
class Summary:
    programs: int = 0
    compiles: int = 0
    seconds: float = 0.0
    verdicts: dict[Verdict, int] = field(default_factory=lambda: {v: 0 for v in Verdict})
    refusals: dict[str, int] = field(default_factory=dict)
    failures: list[Outcome] = field(default_factory=list)  # wrong and crashed
    refused: list[Outcome] = field(default_factory=list)

    def add(self, outcome: Outcome) -> None:
        self.programs += 1
        self.verdicts[outcome.verdict] += 1
        if outcome.verdict is Verdict.REFUSED:
            self.refusals[outcome.detail] = self.refusals.get(outcome.detail, 0) + 1
            self.refused.append(outcome)
        if outcome.verdict in (Verdict.WRONG, Verdict.CRASH):
            self.failures.append(outcome)

    def line(self) -> str:
        v = self.verdicts
        return (f"programs {self.programs}: compiled and matching {v[Verdict.MATCH]}, refused {v[Verdict.REFUSED]}, "
                f"wrong {v[Verdict.WRONG]}, crashed {v[Verdict.CRASH]}, invalid in eager {v[Verdict.INVALID]}; "
                f"{self.compiles} compiles in {self.seconds:.0f} s")


def mismatch(actual, expected, unsettled: torch.Tensor | None = None,
             exact: torch.Tensor | None = None) -> str | None:
    """Why `actual` is not eager's `expected`, or None. Exact dtype and shape; exact
    integers and bools; NaN where eager has NaN, Inf of the same sign where eager has
    Inf; finite floats within the dtype's tolerance (the sign of zero is not compared),
    except where `unsettled` (see `unsettled_values`) marks a value that rounding of
    the inputs alone moves beyond that tolerance. Where eager's NaN or Inf is not the
    program's value in float64 (`exact`) and tori's is, tori is right: eager's float32
    gelu(inf) is NaN in its vector kernel, inf on one element and in float64."""
    if not isinstance(actual, torch.Tensor):
        return f"a {type(actual).__name__} instead of a tensor"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, eager {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {tuple(actual.shape)}, eager {tuple(expected.shape)}"
    if not expected.dtype.is_floating_point:
        differ = actual != expected
        if differ.any():
            return f"{int(differ.sum())} of {expected.numel()} values differ: {_first(actual, expected, differ)}"
        return None
    a, e = actual.double(), expected.double()
    right = torch.zeros_like(a, dtype=torch.bool)
    if isinstance(exact, torch.Tensor) and exact.shape == a.shape and exact.dtype.is_floating_point:
        x = exact.double()
        right = ((a == x) | (a.isnan() & x.isnan())) & ~((e == x) | (e.isnan() & x.isnan()))
    nan_differ = (a.isnan() != e.isnan()) & ~right
    if nan_differ.any():
        return f"NaN where eager has none or the reverse: {_first(actual, expected, nan_differ)}"
    inf_differ = (a.isinf() | e.isinf()) & ~(a == e) & ~right
    if inf_differ.any():
        return f"Inf differs: {_first(actual, expected, inf_differ)}"
    rtol, atol = TOLERANCES[expected.dtype]
    finite = e.isfinite()
    far = finite & ((a - e).abs() > atol + rtol * e.abs())
    if unsettled is not None and unsettled.shape == far.shape:
        far &= ~unsettled
    if far.any():
        return f"{int(far.sum())} of {expected.numel()} values beyond rtol={rtol}, atol={atol}: {_first(actual, expected, far)}"
    return None


def _first(actual, expected, where) -> str:
    index = tuple(int(i) for i in where.nonzero()[0])
    return f"at {list(index)} tori {actual[index].item()!r}, eager {expected[index].item()!r}"


def _eager(program: Program, mode: Mode = Mode.VALUES) -> tuple[list, list[torch.Tensor]] | Exception:
    """The inputs of each call and the program's flat results over them, in eager."""
    # Eager runs with subnormal numbers flushed to zero, as IREE's CPU code does
    # (docs/limitations.md): a subnormal intermediate (1.5 / 3e38) then gives the
    # same log(0) = -inf in both, and the fuzzer looks for other differences.
    flushing = torch.set_flush_denormal(True)
    try:
        fn = build(program.function_source(), "program")
        run_program(fn, [spec.make() for spec in program.inputs], mode)  # eager refuses the program: invalid

        def valid(inputs) -> bool:
            try:
                run_program(fn, inputs, mode)
                return True
            except Exception:
                return False

        calls = call_inputs(program, mode, valid)
        return calls, [r for inputs in calls for r in run_program(fn, inputs, mode)]
    except Exception as error:
        return error
    finally:
        if flushing:
            torch.set_flush_denormal(False)


def _float64_runs(program: Program, mode: Mode, calls: list[list[torch.Tensor]] | None):
    """The program's results in float64 on its inputs, and on its inputs moved by up
    to one float32 rounding (relative 2^-24); None where it does not run so."""
    generator = torch.Generator().manual_seed(0)
    calls = calls if calls is not None else [[spec.make() for spec in program.inputs]]
    exact, moved = [], []
    for inputs in calls:
        exact.append([]), moved.append([])
        for value in inputs:
            if value.dtype.is_floating_point:
                value = value.double()
                jitter = (torch.rand(value.shape, generator=generator, dtype=torch.float64) * 2 - 1) * 2.0 ** -24
                exact[-1].append(value)
                moved[-1].append(torch.where(torch.isfinite(value), value * (1 + jitter), value))
            else:
                exact[-1].append(value)
                moved[-1].append(value.clone())
    try:
        fn = build(program.function_source(), "program")
        return ([r for inputs in exact for r in run_program(fn, inputs, mode)],
                [r for inputs in moved for r in run_program(fn, inputs, mode)])
    except Exception:
        return None


def unsettled_values(program: Program, mode: Mode = Mode.VALUES,
                     calls: list[list[torch.Tensor]] | None = None, runs=None) -> list[torch.Tensor | None]:
    """Per result, where its float values are not determined at the result dtype's
    tolerance: the program in float64 on its inputs and on the inputs moved by up to
    one float32 rounding disagree beyond it (`runs`: `_float64_runs`' results). Sums
    of huge terms that cancel are such values: `[0.5, -3e38, 3e38] @ [1, 0.39, 0.39]`
    is 0 in eager, -1.9e30 with a fused multiply-add, and either is within rounding
    of the terms. None for a result (or a program) that is not a float tensor in both runs."""
    count = len(result_names(program, mode, len(calls) if calls is not None else 1))
    runs = runs if runs is not None else _float64_runs(program, mode, calls)
    if runs is None:
        return [None] * count
    first, second = runs
    expected = _eager(program, mode)
    expected = expected[1] if not isinstance(expected, Exception) else None
    marks = []
    for k, (a, b) in enumerate(zip(first, second)):
        dtype = expected[k].dtype if expected is not None and k < len(expected) else None
        if (not isinstance(a, torch.Tensor) or not a.dtype.is_floating_point or dtype not in TOLERANCES
                or a.shape != b.shape):
            marks.append(None)
            continue
        rtol, atol = TOLERANCES[dtype]
        both = torch.isfinite(a) & torch.isfinite(b)
        marks.append(both & ((a - b).abs() > atol + rtol * a.abs()))
    return marks


def _refusal(error: CompileError) -> str:
    return f"{error.stage}: {error.op or error.reason.splitlines()[0][:120]}"


def check(programs: list[Program], summary: Summary, mode: Mode = Mode.VALUES) -> list[Outcome]:
    """Outcomes of `programs` in `mode`, compiled together where they agree."""
    start = time.perf_counter()
    expected = {}
    outcomes: dict[int, Outcome] = {}
    for i, program in enumerate(programs):
        result = _eager(program, mode)
        if isinstance(result, Exception):
            outcomes[i] = Outcome(program, Verdict.INVALID, f"{type(result).__name__}: {result}")
        else:
            expected[i] = result
    pending = sorted(expected)
    if pending:
        _check_group(programs, pending, expected, outcomes, summary, mode)
    summary.seconds += time.perf_counter() - start
    ordered = [outcomes[i] for i in range(len(programs))]
    for outcome in ordered:
        summary.add(outcome)
    return ordered


def _check_group(programs, indices, expected, outcomes, summary, mode) -> None:
    group = [programs[i] for i in indices]
    summary.compiles += 1
    actual, error = compiled(group, [expected[i][0] for i in indices], mode)
    if error is not None:
        if len(indices) > 1:  # halve until the programs that fail are alone
            half = len(indices) // 2
            _check_group(programs, indices[:half], expected, outcomes, summary, mode)
            _check_group(programs, indices[half:], expected, outcomes, summary, mode)
            return
        i = indices[0]
        if isinstance(error, CompileError):
            outcomes[i] = Outcome(programs[i], Verdict.REFUSED, _refusal(error))
        else:
            outcomes[i] = Outcome(programs[i], Verdict.CRASH, f"{type(error).__name__}: {str(error)[:2000]}")
        return
    disagreeing = []
    for i, results in zip(indices, actual):
        calls, wanted = expected[i]
        names = result_names(programs[i], mode, len(calls))
        problems = [f"{names[k]}: {why}" for k, (a, e) in enumerate(zip(results, wanted))
                    if (why := mismatch(a, e)) is not None]
        if len(results) != len(wanted):
            problems.append(f"{len(results)} results, eager {len(wanted)}")
        if problems:  # judged again without the values that input rounding alone unsettles
            runs = _float64_runs(programs[i], mode, calls)
            unsettled = unsettled_values(programs[i], mode, calls, runs)
            exact = runs[0] if runs is not None else []
            problems = [f"{names[k]}: {why}" for k, (a, e) in enumerate(zip(results, wanted))
                        if (why := mismatch(a, e, unsettled[k] if k < len(unsettled) else None,
                                            exact[k] if k < len(exact) else None)) is not None]
            if len(results) != len(wanted):
                problems.append(f"{len(results)} results, eager {len(wanted)}")
        if problems and mode is Mode.GRADIENTS:  # a gradient as AOTAutograd's trace computes it is not tori's fault
            traced = traced_gradients(build(programs[i].function_source(), "program"), calls[0])
            if traced is not None and len(traced) == len(results):
                problems = [f"{names[k]}: {why}" for k, (a, e) in enumerate(zip(results, wanted))
                            if (why := mismatch(a, e)) is not None and mismatch(a, traced[k]) is not None]
        if problems:
            disagreeing.append((i, "; ".join(problems)))
        else:
            outcomes[i] = Outcome(programs[i], Verdict.MATCH)
    for i, why in disagreeing:
        if len(indices) > 1:
            _check_group(programs, [i], expected, outcomes, summary, mode)
            if outcomes[i].verdict is Verdict.MATCH:  # wrong only next to other programs
                outcomes[i] = Outcome(programs[i], Verdict.WRONG, f"only when batched: {why}\n{batch_source(group)}")
        else:
            outcomes[i] = Outcome(programs[i], Verdict.WRONG, why)
