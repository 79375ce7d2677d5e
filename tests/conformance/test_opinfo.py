"""A fixed slice of PyTorch's OpInfo database through tori with fallback='error'
(`make conformance` runs every op): each op must agree with the committed
expected-failures list, which only shrinks."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("expecttest", reason="the OpInfo database needs the expecttest package (the test extra)")

from tori.conformance import expectations  # noqa: E402
from tori.conformance.__main__ import EXPECTED  # noqa: E402
from tori.conformance.opinfo import DTYPES, Kind, Outcome, Status, op_database, ops_for  # noqa: E402
from tori.conformance.runner import run_ops  # noqa: E402

# Every n-th op of the sorted OpInfo names, per dtype: spread over the whole database
# and fixed, so that a run is comparable with the last.
EVERY = {"float32": 7, "float16": 15}


def _slice(dtype: str) -> list[str]:
    return sorted(ops_for(DTYPES[dtype]))[::EVERY[dtype]]


CASES = [(dtype, op) for dtype in EVERY for op in _slice(dtype)]


@pytest.fixture(scope="module")
def expected():
    return expectations.load(EXPECTED)


@pytest.fixture(scope="module")
def outcomes():
    """Every case of the slice, checked in two worker processes (a compiler crash
    costs one op, not the test session)."""
    found = {}
    for dtype in EVERY:
        for outcome in run_ops(_slice(dtype), dtype, jobs=2, timeout_s=300):
            found[dtype, outcome.op] = outcome
    return found


@pytest.mark.parametrize("dtype,op", CASES, ids=[f"{dtype}-{op}" for dtype, op in CASES])
def test_opinfo_slice(outcomes, expected, dtype, op):
    outcome = outcomes[dtype, op]
    problem = expectations.unexpected(outcome, expected)
    assert problem is None, problem


def test_the_slice_compiles_most_ops_natively(outcomes):
    counted = [o for o in outcomes.values() if o.status is not Status.SKIP]
    passed = [o for o in counted if o.status is Status.PASS]
    assert len(counted) >= 100
    assert len(passed) / len(counted) >= 0.75, expectations.summary_table(list(outcomes.values()))


def test_every_expected_failure_names_an_op_with_that_dtype_and_a_reason(expected):
    database = op_database()
    for dtype, ops in expected.items():
        assert dtype in DTYPES, f"unknown dtype section [{dtype}]"
        for op, reason in ops.items():
            assert op in database, f"[{dtype}] {op}: no such OpInfo entry"
            assert database[op].supports_dtype(DTYPES[dtype], "cpu"), f"[{dtype}] {op}: the op has no {dtype}"
            assert reason.strip(), f"[{dtype}] {op}: no reason given"


def test_the_list_only_shrinks():
    listed = {"float32": {"sort": "compile: no lowering"}}
    fixed = Outcome("sort", "float32", Status.PASS)
    broken = Outcome("abs", "float32", Status.FAIL, Kind.MISMATCH, "output[0] differs")
    still_failing = Outcome("sort", "float32", Status.FAIL, Kind.COMPILE, "no lowering")
    skipped = Outcome("item", "float32", Status.SKIP, Kind.EAGER)
    assert "passes now" in expectations.unexpected(fixed, listed)
    assert "fails [mismatch]" in expectations.unexpected(broken, listed)
    assert expectations.unexpected(still_failing, listed) is None
    assert expectations.unexpected(skipped, listed) is None


def test_a_wrong_result_is_caught():
    """The checker itself: an op whose compiled result differs from eager's fails."""
    from tori.conformance.opinfo import _compare

    kind, detail = _compare((torch.ones(3),), (torch.zeros(3),), rtol=1e-5, atol=1e-5, values=True, what="output")
    assert kind is Kind.MISMATCH and "output[0]" in detail
    kind, _ = _compare((torch.ones(3, dtype=torch.float64),), (torch.ones(3),), rtol=1e-5, atol=1e-5, values=True,
                       what="output")
    assert kind is Kind.DTYPE
