"""PyTorch's OpInfo database through tori with fallback='error' (`make conformance`
runs every op): every op on the committed expected-failures list, and a fixed slice
of the others, must agree with that list, which only shrinks: a listed op that
passes, or fails another way than listed, fails here."""

from __future__ import annotations

import pytest
import torch

import expecttest  # noqa: F401  (the OpInfo database needs it: the test extra installs it)

from tori.conformance import expectations
from tori.conformance.__main__ import EXPECTED
from tori.conformance.opinfo import DTYPES, Kind, Outcome, Status, op_database, ops_for
from tori.conformance.runner import run_ops

# Every n-th op of the sorted OpInfo names, per dtype: spread over the whole database
# and fixed, so that a run is comparable with the last. CI checks every 21st float32
# and every 45th float16 op (about 1 s each); `make test-extended` every 7th and 15th,
# a slice that holds CI's.
EVERY = {"float32": 7, "float16": 15}
CI_EVERY = {"float32": 21, "float16": 45}


def _listed(dtype: str) -> list[str]:
    return sorted(expectations.load(EXPECTED).get(dtype, {}))


def _cases(dtype: str, every: int) -> list[str]:
    """The slice, and every op listed as failing in `dtype`."""
    return sorted(set(sorted(ops_for(DTYPES[dtype]))[::every]) | set(_listed(dtype)))


# One worker runs the whole module: the `outcomes` fixture checks every case of the
# session at once, and under pytest-xdist each worker would check them all again.
pytestmark = pytest.mark.xdist_group("opinfo")

CI_CASES = {(dtype, op) for dtype in CI_EVERY for op in _cases(dtype, CI_EVERY[dtype])}
CASES = [pytest.param(dtype, op, id=f"{dtype}-{op}", marks=[] if (dtype, op) in CI_CASES else [pytest.mark.extended])
         for dtype in EVERY for op in _cases(dtype, EVERY[dtype])]


@pytest.fixture(scope="module")
def expected():
    return expectations.load(EXPECTED)


@pytest.fixture(scope="module")
def outcomes(request):
    """The cases this session runs (CI's slice where it runs none of them), checked in
    two worker processes (a compiler crash costs one op, not the test session)."""
    wanted: dict[str, set[str]] = {}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is request.module and "op" in params:
            wanted.setdefault(params["dtype"], set()).add(params["op"])
    if not wanted:
        for dtype, op in CI_CASES:
            wanted.setdefault(dtype, set()).add(op)
    found = {}
    for dtype, ops in wanted.items():
        for outcome in run_ops(sorted(ops), dtype, jobs=2, timeout_s=300):
            found[dtype, outcome.op] = outcome
    return found


@pytest.mark.parametrize("dtype,op", CASES)
def test_opinfo_slice(outcomes, expected, dtype, op):
    outcome = outcomes[dtype, op]
    problem = expectations.unexpected(outcome, expected)
    assert problem is None, problem


def test_the_slice_compiles_most_ops_natively(outcomes, expected):
    listed = {(dtype, op) for dtype, ops in expected.items() for op in ops}
    counted = [o for key, o in outcomes.items() if o.status is not Status.SKIP and key not in listed]
    passed = [o for o in counted if o.status is Status.PASS]
    assert len(counted) >= 35
    assert len(passed) / len(counted) >= 0.75, expectations.summary_table(list(outcomes.values()))


def test_every_expected_failure_names_an_op_with_that_dtype_and_a_reason(expected):
    database = op_database()
    for dtype, ops in expected.items():
        assert dtype in DTYPES, f"unknown dtype section [{dtype}]"
        for op, reason in ops.items():
            assert op in database, f"[{dtype}] {op}: no such OpInfo entry"
            assert database[op].supports_dtype(DTYPES[dtype], "cpu"), f"[{dtype}] {op}: the op has no {dtype}"
            kind = expectations.listed_kind(reason)
            assert kind is not None, (f"[{dtype}] {op}: the reason must start with the kind of failure, one of "
                                      f"{expectations.failure_kinds()}: {reason!r}")
            assert reason.split(":", 1)[1].strip(), f"[{dtype}] {op}: no reason after the kind"


def test_every_listed_op_is_checked(expected):
    for dtype, ops in expected.items():
        assert dtype in EVERY, f"[{dtype}] is listed but not checked by the suite"
        assert set(ops) <= {op for listed_dtype, op in CI_CASES if listed_dtype == dtype}


def test_the_real_list_only_shrinks_and_keeps_its_kinds(expected):
    """unexpected() on the committed list: each listed op passing, failing as listed,
    and failing each other way; and an op off the list failing."""
    for dtype, ops in expected.items():
        unlisted = next(op for op in sorted(ops_for(DTYPES[dtype])) if op not in ops)
        assert "fails [mismatch]" in expectations.unexpected(
            Outcome(unlisted, dtype, Status.FAIL, Kind.MISMATCH, "output[0] differs"), expected)
        assert expectations.unexpected(Outcome(unlisted, dtype, Status.PASS), expected) is None
        for op, reason in ops.items():
            kind = expectations.listed_kind(reason)
            assert "passes now" in expectations.unexpected(Outcome(op, dtype, Status.PASS), expected)
            assert expectations.unexpected(Outcome(op, dtype, Status.FAIL, kind, "as before"), expected) is None
            assert expectations.unexpected(Outcome(op, dtype, Status.SKIP, Kind.EAGER), expected) is None
            for other in (Kind.MISMATCH, Kind.CRASH, Kind.TIMEOUT, Kind.COMPILE):
                if other is not kind:
                    problem = expectations.unexpected(Outcome(op, dtype, Status.FAIL, other, "new"), expected)
                    assert f"fails [{other.value}], but is listed as failing [{kind.value}]" in problem


def test_update_keeps_a_reason_while_the_kind_holds(tmp_path):
    previous = {"float32": {"sort": "mismatch: written by hand", "cov": "dynamo: data dependent",
                            "fixed": "compile: no lowering"}}
    outcomes = [Outcome("sort", "float32", Status.FAIL, Kind.MISMATCH, "output[1] differs"),
                Outcome("cov", "float32", Status.FAIL, Kind.CRASH, "the process running it died (exit status -11)"),
                Outcome("fixed", "float32", Status.PASS)]
    path = tmp_path / "expected.toml"
    expectations.write(path, outcomes, previous, "# header")
    assert expectations.load(path) == {"float32": {
        "sort": "mismatch: written by hand", "cov": "crash: the process running it died (exit status -11)"}}


def test_a_wrong_result_is_caught():
    """The checker itself: an op whose compiled result differs from eager's fails."""
    from tori.conformance.opinfo import _compare

    kind, detail = _compare((torch.ones(3),), (torch.zeros(3),), rtol=1e-5, atol=1e-5, values=True, what="output")
    assert kind is Kind.MISMATCH and "output[0]" in detail
    kind, _ = _compare((torch.ones(3, dtype=torch.float64),), (torch.ones(3),), rtol=1e-5, atol=1e-5, values=True,
                       what="output")
    assert kind is Kind.DTYPE
