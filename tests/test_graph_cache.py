"""The Dynamo graph cache: a graph compiled before is served without AOTAutograd,
its key names what decides the compile, and graphs it cannot describe are left to
the full path."""

import logging

import pytest
import torch

import tori
import tori.frontend.backend as backend
from tori.frontend import graph_cache
from tori.config import Options
from tori.frontend.graph_cache import graph_key
from tori.testing import cache_entries, count_graphs


@pytest.fixture(autouse=True)
def grad_mode_restored():
    with torch.set_grad_enabled(True):
        yield


def _model():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()


def _run(module, x, options):
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(module, backend="tori", options={"fallback": "error", **options})(x)


def _captured(fn, *inputs, grad=False):
    """Dynamo's graph of `fn` and the inputs it hands a backend."""
    seen = []

    def capture(gm, example_inputs):
        seen.append((gm, list(example_inputs)))
        return gm.forward

    torch._dynamo.reset()
    with torch.set_grad_enabled(grad):
        torch.compile(fn, backend=capture, fullgraph=True)(*inputs)
    return seen[0]


def test_a_graph_compiled_before_skips_aotautograd(tmp_path, monkeypatch):
    options = {"cache_dir": str(tmp_path)}
    model, x = _model(), torch.randn(5, 8)
    with count_graphs() as cold:
        torch.testing.assert_close(_run(model, x, options), model(x))
    assert (cold.iree_compiles, cold.graph_cache_hits) == (1, 0)

    def no_tracing(**_):
        raise AssertionError("AOTAutograd traced a graph the graph cache holds")

    monkeypatch.setattr(backend, "aot_autograd", no_tracing)
    other = _model()
    with torch.no_grad():
        other[0].weight.mul_(-1)  # other weights: arguments, not part of the key
    with count_graphs() as warm:
        torch.testing.assert_close(_run(other, x, options), other(x))
    assert (warm.iree_compiles, warm.cache_hits, warm.graph_cache_hits, warm.compiled_graphs) == (0, 1, 1, 1)
    assert warm.compiled_calls == 1
    record = tori.last_compile().graphs[0]
    assert record.from_graph_cache and record.modules_key
    # Its record shows the stages a compile of it produced.
    assert "func.func @main" in record.stages["tori"] and record.stages["vmfb"][:4] and "iree-compile" in \
        record.stages["iree"]


def test_the_key_names_shapes_dtypes_options_and_code():
    def fn(x):
        return torch.relu(x) * 2

    base = Options()
    torch.set_grad_enabled(False)  # as Dynamo calls a backend under no_grad (restored by the fixture below)
    key = graph_key(*_captured(fn, torch.randn(3, 4)), base)
    assert key is not None
    assert key == graph_key(*_captured(fn, torch.randn(3, 4)), base)
    assert key == graph_key(*_captured(fn, torch.randn(3, 4)), base.replace(fallback="error", driver="local-sync"))
    others = {
        graph_key(*_captured(fn, torch.randn(3, 5)), base),
        graph_key(*_captured(fn, torch.randn(3, 4, dtype=torch.float64)), base),
        graph_key(*_captured(fn, torch.randn(4, 3).t()), base),  # strides
        graph_key(*_captured(lambda x: torch.relu(x) * 3, torch.randn(3, 4)), base),
        graph_key(*_captured(fn, torch.randn(3, 4)), base.replace(pipeline="")),
        graph_key(*_captured(fn, torch.randn(3, 4)), base.replace(runtime_checks=False)),
        graph_key(*_captured(fn, torch.randn(3, 4)), base.replace(iree_flags=("--iree-opt-level=O1",))),
    }
    assert None not in others and key not in others and len(others) == 7


@torch.compiler.allow_in_graph
def _user_function(x):
    return x + 1


@torch.compiler.assume_constant_result
def _table():
    return torch.arange(4.0)


@pytest.mark.parametrize("case", ["grad", "allow_in_graph", "assume_constant_result", "dumps", "dynamic",
                                  "cache off"])
def test_graphs_it_cannot_describe_have_no_key(case, tmp_path):
    x = torch.randn(3, 4)
    fn, grad, options = (lambda x: x.sin()), False, Options()
    if case == "grad":
        grad, x = True, x.requires_grad_()
    elif case == "allow_in_graph":
        fn = lambda x: _user_function(x).sin()  # noqa: E731
    elif case == "assume_constant_result":
        fn = lambda x: x * _table()  # noqa: E731
    elif case == "dumps":
        options = options.replace(dump_dir=tmp_path)
    elif case == "dynamic":
        torch._dynamo.mark_dynamic(x, 0)
    else:
        options = options.replace(cache=False)
    captured = _captured(fn, x, grad=grad)
    with torch.set_grad_enabled(grad):
        assert graph_key(*captured, options) is None


def test_a_corrupted_graph_entry_is_recompiled(tmp_path, caplog):
    options = {"cache_dir": str(tmp_path)}
    model, x = _model(), torch.randn(2, 8)
    _run(model, x, options)
    (entry,) = cache_entries(tmp_path, graphs=True)
    entry.write_bytes(entry.read_bytes()[:-20])
    with count_graphs() as count, caplog.at_level(logging.WARNING, logger="tori"):
        torch.testing.assert_close(_run(model, x, options), model(x))
    assert count.cache_corrupt == 1 and count.graph_cache_hits == 0 and count.compiled_graphs == 1
    assert "corrupted" in caplog.text


def test_a_failing_lookup_costs_a_compile_not_the_call(tmp_path, monkeypatch, caplog):
    options = {"cache_dir": str(tmp_path)}
    model, x = _model(), torch.randn(2, 8)
    _run(model, x, options)

    def broken(*_):
        raise OSError("disk gone")

    monkeypatch.setattr(graph_cache, "load", broken)
    with count_graphs() as count, caplog.at_level(logging.WARNING, logger="tori"):
        torch.testing.assert_close(_run(model, x, options), model(x))
    assert count.compiled_graphs == 1 and count.graph_cache_hits == 0 and count.fallback_graphs == 0
    assert "graph cache could not serve" in caplog.text
