"""The per-call path of inference graphs: called without AOTAutograd's runtime
wrapper when it has nothing to do, through it when it has (aliases, mutations,
duplicated arguments), and correct either way."""

import pytest
import torch

import tori
from tori.frontend.backend import tori_backend


def _compile(fn):
    """`fn` compiled with tori; also the callables the backend handed Dynamo."""
    handed = []

    def backend(gm, example_inputs):
        compiled = tori_backend(gm, example_inputs, options={"fallback": "error"})
        handed.append(compiled)
        return compiled

    return torch.compile(fn, backend=backend, fullgraph=True), handed


def _direct(compiled) -> bool:
    return getattr(compiled, "without_aot_wrapper", False)


def test_a_plain_inference_graph_is_called_directly():
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()
    compiled, handed = _compile(model)
    x = torch.randn(4, 16)
    before = tori.counters.compiled_calls
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
    assert len(handed) == 1 and _direct(handed[0])
    assert tori.counters.compiled_calls - before == 3


def test_a_lifted_constant_is_passed_first():
    @torch.compiler.assume_constant_result
    def table():
        return torch.arange(6.0).reshape(2, 3)

    def fn(x):
        return x * table() + 1

    compiled, handed = _compile(fn)
    x = torch.randn(2, 3)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), fn(x))
    assert _direct(handed[0])


def test_an_output_aliasing_an_input_keeps_the_wrapper():
    def fn(x):
        return x.view(-1), torch.relu(x)

    compiled, handed = _compile(fn)
    x = torch.randn(3, 4)
    with torch.no_grad():
        view, relu = compiled(x)
    assert not _direct(handed[0])
    assert view.data_ptr() == x.data_ptr() and view.shape == (12,)
    torch.testing.assert_close(relu, torch.relu(x))


def test_an_input_mutation_keeps_the_wrapper():
    def fn(x):
        x.add_(1)
        return x * 2

    compiled, handed = _compile(fn)
    x = torch.zeros(4)
    with torch.no_grad():
        out = compiled(x)
    assert not _direct(handed[0])
    torch.testing.assert_close(x, torch.ones(4))
    torch.testing.assert_close(out, torch.full((4,), 2.0))


@pytest.mark.parametrize("same", [True, False])
def test_one_tensor_passed_twice(same):
    def fn(a, b):
        return a * 2 + b

    compiled, handed = _compile(fn)
    a = torch.randn(5)
    b = a if same else torch.randn(5)
    with torch.no_grad():
        torch.testing.assert_close(compiled(a, b), fn(a, b))
    # Dynamo passes a tensor given twice once, and guards on the aliasing.
    assert _direct(handed[-1])
    with torch.no_grad():
        torch.testing.assert_close(compiled(a, a.clone()), fn(a, a))
