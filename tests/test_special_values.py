"""Special values through compiled graphs, compared with eager: pow's C semantics
(negative bases, zeros, infinities, NaN), std without overflow of the squares, and
integer division by zero as an error rather than garbage."""

from __future__ import annotations

import math

import pytest
import torch

import tori
from tori.errors import CheckFailedError, IndexOutOfRangeError

INF, NAN = math.inf, math.nan


def compiled_calls(fn, *args, fallback="error"):
    torch._dynamo.reset()
    tori.counters.clear()
    result = torch.compile(fn, backend="tori", options={"fallback": fallback})(*args)
    assert tori.counters.compiled_calls == 1 and tori.counters.fallback_calls == 0
    return result


def assert_same_values(actual: torch.Tensor, expected: torch.Tensor, where) -> None:
    """Equal within float rounding, NaN where eager has NaN, and zeros and infinities
    of eager's sign."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=2e-6, atol=0)
    signed = ~torch.isnan(expected) & ((expected == 0) | torch.isinf(expected))
    bad = signed & (torch.signbit(actual) != torch.signbit(expected))
    assert not bad.any(), [where[i] for i in bad.nonzero().flatten().tolist()]


POW_CASES = [
    (0, 0), (NAN, 0), (1, NAN), (1, INF), (-1, INF), (-1, -INF), (-2, 3), (-2, -3), (-2, 4), (-2, 0.5),
    (-8, 1 / 3), (0, -1), (-0.0, -1), (-0.0, -2), (-0.0, 3), (-0.0, 0.5), (-INF, 3), (-INF, 2), (-INF, -3),
    (-INF, 2.5), (INF, -1), (0.5, INF), (2, -INF), (2, 10), (1e-30, 2), (3, 40), (NAN, NAN), (-1.5, 2.0),
]


def test_pow_follows_c_special_values():
    # IREE's exp(y * log(x)) gave NaN for every negative base (pow(-2, 3)), for 0^0 and
    # 1^NaN, and lost the sign of -0.0 and -inf.
    x = torch.tensor([a for a, _ in POW_CASES])
    y = torch.tensor([b for _, b in POW_CASES])

    def powers(x, y):
        return torch.pow(x, y), x ** 2.5, x ** 2.0, x ** 3, x ** 3.0, torch.pow(x.half(), y.half())

    for actual, expected in zip(compiled_calls(powers, x, y), powers(x, y)):
        assert_same_values(actual, expected, POW_CASES)


def test_squares_and_cubes_by_float_exponents_are_eagers_products():
    # Eager's CPU kernel computes x ** 2.0 and x ** 3.0 as x*x and x*x*x (GPT-2's tanh
    # GELU cubes its input): the same products, bit for bit, and no pow in the module.
    torch.manual_seed(0)
    x = torch.randn(4, 3072) * 3

    def gelu_tanh(x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0)))), x ** 2.0

    actual = compiled_calls(gelu_tanh, x)
    expected = gelu_tanh(x)
    torch.testing.assert_close(actual[0], expected[0], rtol=2e-6, atol=1e-6)
    assert torch.equal(actual[1], expected[1])
    assert "pow" not in tori.last_compile().graphs[0].stages["torch"]


def test_std_of_huge_and_tiny_values_matches_eager():
    # Eager accumulates float32 moments in float64; IREE squared 1e20 to inf and 1e-25 to 0.
    torch.manual_seed(0)
    x = torch.randn(6, 50)
    scales = torch.tensor([1e20, 1e-25, 1.0, 3e37, 1e-18, 0.0]).unsqueeze(1)

    def moments(x):
        return x.std(), x.std(dim=1), x.std(dim=1, keepdim=True, correction=0), torch.std_mean(x, dim=1)[0], x.var(dim=1)

    values = x * scales
    for actual, expected in zip(compiled_calls(moments, values), moments(values)):
        torch.testing.assert_close(actual, expected, rtol=1e-5, atol=0)
    assert torch.isfinite(compiled_calls(moments, values)[1][:5]).all()


@pytest.mark.parametrize("fallback", ["error", "eager"])
def test_integer_division_by_zero_raises_as_eager_does(fallback):
    a = torch.tensor([7, -7, 5, -9, 0])
    b = torch.tensor([2, 2, -3, 4, 5])

    def divisions(a, b):
        return a // b, torch.remainder(a, b), torch.fmod(a, b), torch.div(a, b, rounding_mode="trunc"), a % 3

    torch._dynamo.reset()
    tori.counters.clear()
    compiled = torch.compile(divisions, backend="tori", options={"fallback": fallback})
    for actual, expected in zip(compiled(a, b), divisions(a, b)):
        assert torch.equal(actual, expected)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        divisions(a, b.clone().fill_(0))  # eager's own error
    with pytest.raises(CheckFailedError, match="ZeroDivisionError: an integer division or remainder by zero"):
        compiled(a, torch.tensor([2, 0, 1, 1, 1]))
    # both calls ran compiled; the failing one raised without an eager rerun
    assert tori.counters.compiled_calls == 2 and tori.counters.fallback_calls == 0
    assert torch.equal(compiled(a, b)[0], a // b)  # the module keeps working


def test_runtime_checks_can_be_turned_off(tmp_path):
    # A check on a graph argument runs in PyTorch before the module (frontend/input_checks.py);
    # one on an index the graph computes is a `torch.runtime.assert` in the torch stage.
    # runtime_checks=False (TORI_RUNTIME_CHECKS=0) compiles neither.
    def divide_and_pick(a, b, x, i):
        return a // b, x[i], x[i.abs() % 5]

    a, b = torch.tensor([7, -7]), torch.tensor([2, 3])
    x = torch.randn(4)
    found = {}
    for checks in (True, False):
        torch._dynamo.reset()
        dump = tmp_path / str(checks)
        compiled = torch.compile(divide_and_pick, backend="tori",
                                 options={"fallback": "error", "runtime_checks": checks, "dump_dir": str(dump)})
        if checks:
            with pytest.raises(IndexOutOfRangeError, match="outside -4 <= index < 4"):
                compiled(a, b, x, torch.tensor([4, 0]))  # the host's check
            with pytest.raises(IndexOutOfRangeError, match="outside -4 <= index < 4"):
                compiled(a, b, x, torch.tensor([-4, 0]))  # in range, but |-4| % 5 is not: the module's check
        i_in_range = torch.tensor([3, -2])
        quotient, picked, again = compiled(a, b, x, i_in_range)
        assert torch.equal(quotient, a // b) and torch.equal(picked, x[i_in_range])
        assert torch.equal(again, x[i_in_range.abs() % 5])
        (torch_stage,) = dump.glob("*/02-torch.mlir")
        (graph,) = [g for r in tori.compile_records() for g in r.graphs if g.name.endswith("_inference")][-1:]
        host = graph.compiled.signature.input_checks
        found[checks] = (torch_stage.read_text().count("torch.runtime.assert"), host and host.messages)
    assert found[False] == (0, None)
    in_module, on_host = found[True]
    assert in_module == 1  # x[|i| % 5]: its index is computed
    assert on_host == ("ZeroDivisionError: an integer division or remainder by zero",
                       "index out of range in index: an index for dimension 0 (size 4) is outside -4 <= index < 4")


@pytest.mark.parametrize("pipeline", ["", "tori-fold-empty-tensors, tori-fold-constants"])
def test_negative_numbers_on_constant_tensors(pipeline):
    # Torch-MLIR's folders, which IREE runs on constant operands, read a negative
    # `torch.constant.int` as unsigned: `torch.full((2,), 3.0) * -2` was 5.5e19, a conv1d
    # weight `linspace(-1, 1, 2)` had 2^64 for -1 (found by the fuzzer), a clamp to
    # [-2, -1] gave -2. tori writes such numbers as floats at import.
    def constants(x):
        return (x * (torch.full((2,), 3.0) * -2), x * (torch.arange(2).float() - 5), x * torch.linspace(-1, 1, 2),
                x * torch.full((2,), 3.0).clamp(min=-2, max=-1), x * (-3 - torch.full((2,), 3.0)),
                x * torch.add(torch.full((2,), 3.0), torch.full((2,), 1.0), alpha=-2),
                x * (torch.full((2,), -3.0) < -2), x * torch.full((2,), -3).float(),
                torch.nn.functional.conv1d(x.reshape(1, 2), torch.linspace(-1, 1, 2).reshape(2, 1, 1)))

    x = torch.tensor([1.0, -2.0])
    torch._dynamo.reset()
    tori.counters.clear()
    compiled = torch.compile(constants, backend="tori", options={"fallback": "error", "pipeline": pipeline})
    for actual, expected in zip(compiled(x), constants(x)):
        assert torch.equal(actual, expected), (actual, expected)
    assert tori.counters.compiled_calls == 1 and tori.counters.fallback_calls == 0
