"""Checks on a graph's arguments run in PyTorch before its module (frontend/input_checks.py):
the module keeps no assert for them (each was a host wait in IREE's queue), a failing
one raises eager's error class before anything is written, each distinct condition runs
once, and the graph cache keeps them."""

import re

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tori
import tori.frontend.backend as backend
from tori.errors import IndexOutOfRangeError
from tori.frontend.input_checks import InputChecks
from tori.frontend.weight_prologue import Ref, program
from tori.testing import count_graphs


class CacheStep(torch.nn.Module):
    """A decoding step's indexing: a token's embedding written at a position of two
    caches (keys and values), as transformers' static cache does for every layer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.register_buffer("keys", torch.zeros(1, 2, 6, 4))
        self.register_buffer("values", torch.zeros(1, 2, 6, 4))

    def forward(self, token, position):
        x = self.embed(token).view(1, 2, 1, 4)
        self.keys.index_copy_(2, position, x)
        self.values.index_copy_(2, position, -x)
        return (self.keys * self.values).sum(dim=(1, 3))


def _graph():
    (graph,) = [g for r in tori.compile_records() for g in r.graphs][-1:]
    return graph


def test_checks_on_arguments_leave_the_module_and_run_once_each():
    torch._dynamo.reset()
    step, expected = CacheStep(), CacheStep()
    compiled = torch.compile(step, backend="tori", options={"fallback": "error", "cache": False})
    with torch.no_grad():
        for token, position in ((7, 0), (12, 1), (49, 5)):
            args = (torch.tensor([token]), torch.tensor([position]))
            torch.testing.assert_close(compiled(*args), expected(*args))
    torch.testing.assert_close(step.keys, expected.keys)
    graph = _graph()
    assert "torch.runtime.assert" not in graph.stages["torch"]
    # the embedding's token, and the position the two index_copy share: one condition each
    assert graph.compiled.signature.input_checks.messages == (
        "index out of range in embedding: an index for dimension 0 (size 50) is outside 0 <= index < 50",
        "index out of range in index_copy: an index for dimension 2 (size 6) is outside 0 <= index < 6")


@pytest.mark.parametrize("token, position, message", [
    (50, 1, "in embedding: an index for dimension 0 (size 50) is outside 0 <= index < 50"),
    (3, 6, "in index_copy: an index for dimension 2 (size 6) is outside 0 <= index < 6"),
    (3, -1, "in index_copy: an index for dimension 2 (size 6) is outside 0 <= index < 6"),
])
def test_a_failing_check_raises_eagers_class_and_writes_nothing(token, position, message):
    torch._dynamo.reset()
    tori.counters.clear()
    step = CacheStep()
    compiled = torch.compile(step, backend="tori", options={"fallback": "eager", "cache": False})
    with torch.no_grad():
        compiled(torch.tensor([4]), torch.tensor([2]))
        before = step.keys.clone(), step.values.clone()
        with pytest.raises(IndexOutOfRangeError, match=re.escape(message)) as raised:
            compiled(torch.tensor([token]), torch.tensor([position]))
    assert isinstance(raised.value, IndexError)  # eager raises IndexError for both ops
    assert torch.equal(step.keys, before[0]) and torch.equal(step.values, before[1])
    # the failing call was the compiled graph's: no eager rerun
    assert tori.counters.compiled_calls == 2 and tori.counters.fallback_calls == 0


def test_the_graph_cache_keeps_the_checks(tmp_path, monkeypatch):
    options = {"fallback": "error", "cache_dir": str(tmp_path)}
    for served in (False, True):
        torch._dynamo.reset()
        if served:
            def no_tracing(**_):
                raise AssertionError("AOTAutograd traced a graph the graph cache holds")

            monkeypatch.setattr(backend, "aot_autograd", no_tracing)
        embed = torch.nn.Embedding(50, 8)
        with count_graphs() as counted, torch.no_grad():
            compiled = torch.compile(lambda t, p: embed(t).index_select(1, p), backend="tori", options=options)
            torch.testing.assert_close(compiled(torch.tensor([1, 2]), torch.tensor([3])),
                                       embed(torch.tensor([1, 2]))[:, 3:4])
            with pytest.raises(IndexOutOfRangeError, match="in index_select"):
                compiled(torch.tensor([1, 2]), torch.tensor([9]))
        assert counted.graph_cache_hits == int(served)
        assert len(_graph().compiled.signature.input_checks.messages) == 2


def test_equal_steps_are_kept_once_but_numbers_keep_their_types():
    def numbers(x):
        return x + 1, x + 1, x + 1.0, x * 0.0, x * -0.0

    x = torch.tensor([2, -3])
    gm = make_fx(numbers)(x)
    placeholder = gm.graph.find_nodes(op="placeholder")[0]
    outputs = list(gm.graph.output_node().args[0])
    found = program(gm, {placeholder: Ref(0, input=True)}, outputs)
    assert len(found.steps) == 4  # the two `x + 1` are one step; 1 and 1.0, 0.0 and -0.0 are not
    assert found.outputs[0] == found.outputs[1]
    for actual, expected in zip(found.run([x]), numbers(x)):
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    assert str(found.run([x])[4]) == str(x * -0.0)  # the signs of the zeros


def _checks(fn, *examples):
    """The checks tori hoists out of `fn`'s graph."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tori", options={"fallback": "error", "cache": False})
    with torch.no_grad():
        compiled(*examples)
    return _graph().compiled.signature.input_checks


@pytest.mark.parametrize("token, position", [(7, 0), (49, 5), (50, 1), (3, 6), (3, -1), (-1, 2)])
def test_the_conditions_run_in_numpy_as_in_pytorch(token, position):
    checks = _checks(CacheStep(), torch.tensor([4]), torch.tensor([2]))
    assert checks.in_numpy is not None  # every step of the bounds checks has a NumPy form
    args = [torch.tensor([token]), torch.tensor([position])]
    found = _graph().compiled.signature.args
    full = [args.pop(0) if kind.value == "tensor" else None for kind in found]
    expected = [bool(v) for v in checks.conditions.run(full)]
    assert [bool(v) for v in checks.in_numpy(full)] == expected
    assert [bool(v) for v in checks.results(full)] == expected
    assert expected == [0 <= token < 50, 0 <= position < 6]


def test_a_float_scalar_or_argument_leaves_the_conditions_to_pytorch():
    def scaled(x):
        return ((x * 0.5).amax() < 3,)

    def shifted(x):
        return (x.amin() + 1 >= 0,)

    x = torch.tensor([2, -3])
    for fn, numpy_form in ((scaled, False), (shifted, True)):
        gm = make_fx(fn)(x)
        found = program(gm, {gm.graph.find_nodes(op="placeholder")[0]: Ref(0, input=True)},
                        list(gm.graph.output_node().args[0]))
        checks = InputChecks(found, ("a",))
        assert (checks.in_numpy is not None) == numpy_form
        for value in (x, torch.tensor([2.5, -0.5]), torch.tensor([], dtype=torch.int64)):
            try:
                expected = [bool(v) for v in found.run([value])]
            except Exception as error:  # an empty tensor's minimum: PyTorch's error stands
                with pytest.raises(type(error)):
                    checks.results([value])
                continue
            assert [bool(v) for v in checks.results([value])] == expected
