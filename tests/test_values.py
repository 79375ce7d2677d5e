"""Value plumbing between Python and a compiled graph: dtypes, shapes, layouts,
scalars, output structures, aliasing and in-place updates, each against eager.
"""

import pytest
import torch
from torch._dynamo.source import ConstantSource
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from tori.config import Options
from tori.frontend.compile_graph import compile_graph
from tori.frontend.records import GraphRecord, last_compile
from tori.frontend.signature import ArgKind
from tori.testing import assert_matches_eager, count_graphs

ERROR = {"fallback": "error"}


def _compile(fn, dynamic=None):
    return torch.compile(fn, backend="tori", options=ERROR, dynamic=dynamic)


def _assert_all_compiled(count, graphs=None):
    assert count.compiled_graphs >= 1 and count.compiled_calls >= 1, count.delta
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    if graphs is not None:
        assert count.compiled_graphs == graphs, f"expected {graphs} compiled graphs: {count.delta}"


def _sample(dtype, shape=(3, 4)):
    if dtype is torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape).to(dtype)
    return torch.randint(-50, 50, shape, dtype=dtype)


# --- dtypes ---------------------------------------------------------------

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_in_and_out(dtype):
    def fn(x):
        # Each result keeps the input's dtype: no silent promotion or demotion.
        return (x | x, x & x) if dtype is torch.bool else (x * 2, x - x.flip(0))

    with torch.no_grad():
        actual = assert_matches_eager(fn, _sample(dtype))
    assert all(t.dtype is dtype for t in actual)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtype_passthrough_and_conversion_outputs(dtype):
    # Outputs of another dtype than the input: float32 out, and a bool mask out.
    with torch.no_grad():
        actual = assert_matches_eager(lambda x: (x.to(torch.float32), x != x.flip(1)), _sample(dtype))
    assert actual[0].dtype is torch.float32 and actual[1].dtype is torch.bool


def test_uint8_keeps_uint8_and_its_unsigned_values():
    # Values above 127 tell unsigned from signed: wrap-around, comparison, widening
    # and reductions must treat them as unsigned, like eager.
    x = torch.tensor([[0, 1, 127, 128], [200, 250, 255, 3]], dtype=torch.uint8)

    def fn(x):
        return x + 10, x > 100, x.to(torch.int32), x.float(), x.max(dim=1).values, x & 0xF0

    with torch.no_grad():
        actual = assert_matches_eager(fn, x)
    assert actual[0].dtype is torch.uint8 and actual[4].dtype is torch.uint8


def test_int8_keeps_int8():
    x = torch.tensor([[-128, -1, 0, 127], [5, -7, 100, -100]], dtype=torch.int8)
    with torch.no_grad():
        actual = assert_matches_eager(lambda x: (x + 100, x < 0, x.to(torch.int64), x.amin(dim=0)), x)
    assert actual[0].dtype is torch.int8 and actual[3].dtype is torch.int8


def test_float64_keeps_float64_precision():
    # 1 + 1e-12 is exactly representable in float64 only: a float32 round trip loses it.
    x = torch.full((3,), 1e-12, dtype=torch.float64)
    with torch.no_grad():
        actual = assert_matches_eager(lambda x: (x + 1.0) - 1.0, x)
    assert actual.dtype is torch.float64 and (actual > 0).all()


# --- shapes ---------------------------------------------------------------


def test_zero_dim_tensors_in_and_out():
    with torch.no_grad():
        actual = assert_matches_eager(lambda a, b, x: (a * b + 1, (x * a).sum(), x.amax()),
                                      torch.tensor(2.5), torch.tensor(-1.5), torch.randn(3, 4))
    assert all(t.dim() == 0 for t in actual)


def test_empty_tensors():
    def fn(x, y, w):
        return x + 1, x.sum(dim=0), torch.cat([x, y]), x @ w

    with torch.no_grad():
        actual = assert_matches_eager(fn, torch.randn(0, 3), torch.randn(2, 3), torch.randn(3, 2))
    assert actual[0].shape == (0, 3) and actual[1].shape == (3,) and actual[3].shape == (0, 2)


# --- layouts --------------------------------------------------------------

_BASE = torch.arange(60, dtype=torch.float32).reshape(6, 10)

NON_CONTIGUOUS = [
    pytest.param(_BASE.t(), id="transposed"),
    pytest.param(_BASE[:, ::3], id="step_slice"),
    pytest.param(_BASE[2:5, 1:8], id="storage_offset"),
    pytest.param(_BASE[1:, 2].unsqueeze(1).expand(5, 4), id="expanded"),
    pytest.param(torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last), id="channels_last"),
]


def _assert_matches_eager_on_these_tensors(fn, *args):
    # assert_matches_eager passes clones, and a clone of a strided tensor may be
    # contiguous: layout tests call with the caller's tensors themselves.
    compiled = _compile(fn)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(*args)
    _assert_all_compiled(count)
    torch.testing.assert_close(actual, fn(*args))


@pytest.mark.parametrize("x", NON_CONTIGUOUS)
def test_non_contiguous_input(x):
    assert not x.is_contiguous()
    _assert_matches_eager_on_these_tensors(lambda x: (x * 2 + 1, x.sum(dim=0)), x)


@pytest.mark.parametrize("offset", [1, 5, 16], ids=lambda n: f"offset{n}")
def test_contiguous_input_at_an_unaligned_storage_offset(offset):
    # Contiguous, but its data starts `offset` elements into the storage: not at
    # the alignment IREE requires of host memory it imports in place.
    x = torch.randn(offset + 12)[offset:].view(3, 4)
    assert x.is_contiguous() and x.storage_offset() == offset
    _assert_matches_eager_on_these_tensors(lambda x: x * 2 + 1, x)


def test_non_contiguous_integer_input():
    x = torch.arange(24, dtype=torch.int64).reshape(4, 6)[:, 1::2]
    _assert_matches_eager_on_these_tensors(lambda x: x * 3 - 1, x)


# --- Python scalars -------------------------------------------------------


def _scale_shift(x, n, f):
    return x * n + f, x.sum() * f


@pytest.mark.parametrize("dynamic", [None, True], ids=["default", "dynamic"])
def test_python_int_and_float_arguments(dynamic):
    x = torch.randn(3, 4)
    compiled = _compile(_scale_shift, dynamic=dynamic)
    with torch.no_grad(), count_graphs() as count:
        for n, f in [(2, 0.5), (3, -1.25), (7, 1e3)]:
            torch.testing.assert_close(compiled(x, n, f), _scale_shift(x, n, f))
    # Dynamo turns ints and floats whose value changes into graph inputs
    # (SymInt, SymFloat), so at most one recompilation after the first call.
    _assert_all_compiled(count)
    assert count.compiled_graphs <= 2, count.delta


def test_symbolic_scalars_are_graph_inputs():
    x = torch.randn(3, 4)
    compiled = _compile(_scale_shift, dynamic=True)
    with torch.no_grad(), count_graphs() as count:
        for n, f in [(2, 0.5), (3, -1.25), (-4, 2.0)]:
            torch.testing.assert_close(compiled(x, n, f), _scale_shift(x, n, f))
    _assert_all_compiled(count, graphs=1)
    # The int is a SymInt argument; Dynamo passes the float as a 0-d float64 tensor.
    args = last_compile().forward.compiled.signature.args
    assert args.count(ArgKind.INT) >= 1 and args.count(ArgKind.TENSOR) == 2


def test_dynamic_shapes_with_shape_dependent_results():
    def fn(x, n):
        return x.reshape(n, -1) * 2, torch.arange(x.shape[0]) * n, x.shape[1] * n

    compiled = _compile(fn, dynamic=True)
    with torch.no_grad(), count_graphs() as count:
        for rows in (4, 6, 8):
            x = torch.randn(rows, 3)
            actual = compiled(x, 2)
            expected = fn(x, 2)
            torch.testing.assert_close(actual, expected)
    _assert_all_compiled(count, graphs=1)


def test_symint_output_of_the_graph():
    # A size computed inside a dynamic graph comes back as a Python int.
    def fn(x):
        y = x[x.shape[0] // 2:]
        return y * 2, y.shape[0] + 1

    compiled = _compile(fn, dynamic=True)
    with torch.no_grad(), count_graphs() as count:
        for rows in (4, 7):
            x = torch.randn(rows, 2)
            actual = compiled(x)
            torch.testing.assert_close(actual, fn(x))
            assert type(actual[1]) is int
    _assert_all_compiled(count)


def test_symfloat_and_symint_graph_inputs():
    # Dynamo passes unspecialized floats as 0-d tensors; AOT graphs that take a
    # SymFloat directly come from other tracers, built here by hand.
    shape_env = ShapeEnv()
    f = shape_env.create_symfloatnode(shape_env.create_symbol(0.5, ConstantSource("f")), hint=0.5)
    n = shape_env.create_symintnode(shape_env.create_symbol(3, ConstantSource("n")), hint=3)
    with FakeTensorMode(shape_env=shape_env):
        x = torch.empty(3, 4)
        gm = make_fx(lambda x, f, n: x * f + n, tracing_mode="real")(x, f, n)
    compiled = compile_graph(gm, Options(), GraphRecord("symbolic_scalars", "inference"))
    assert compiled.signature.args == (ArgKind.TENSOR, ArgKind.FLOAT, ArgKind.INT)
    x = torch.randn(3, 4)
    with count_graphs() as count:
        for f, n in [(0.5, 3), (-2.25, 7)]:
            torch.testing.assert_close(compiled.run(x, f, n)[0], x * f + n)
    assert count.compiled_calls == 2, count.delta


# --- output structures ----------------------------------------------------


def test_nested_tuple_list_dict_outputs():
    def fn(x, y):
        return {"sum": x + y, "parts": [x * 2, (y - 1, x @ y.t())]}, (x.mean(),)

    with torch.no_grad():
        actual = assert_matches_eager(fn, torch.randn(2, 3), torch.randn(2, 3))
    assert isinstance(actual[0], dict) and isinstance(actual[0]["parts"], list)


def test_python_constant_outputs_alongside_tensors():
    def fn(x):
        return x + 1, 3, "label", None, 2.5, x.shape

    x = torch.randn(2, 3)
    compiled = _compile(fn)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(x)
    _assert_all_compiled(count)
    torch.testing.assert_close(actual[0], x + 1)
    assert actual[1:] == (3, "label", None, 2.5, torch.Size([2, 3]))


def test_input_passthrough_outputs():
    def fn(x, y):
        return x, y + 1, y

    x, y = torch.randn(2, 3), torch.randn(2, 3)
    compiled = _compile(fn)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(x, y)
    _assert_all_compiled(count)
    # Eager returns the caller's tensors themselves.
    assert actual[0] is x and actual[2] is y
    torch.testing.assert_close(actual[1], y + 1)


def test_outputs_that_are_views_of_inputs():
    def fn(x):
        return x[1:], x.t(), x.sum() * 2

    x = torch.randn(3, 4)
    compiled = _compile(fn)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(x)
    _assert_all_compiled(count)
    torch.testing.assert_close(actual, fn(x))
    # As in eager, the views share the input's memory: a later write shows through.
    x[2, 0] = 100.0
    assert actual[0][1, 0] == 100.0 and actual[1][0, 2] == 100.0


def test_output_view_of_an_intermediate_and_of_an_input():
    def fn(x):
        y = x * 2
        return y.view(-1), y[:, 0], x.unsqueeze(0)

    with torch.no_grad():
        assert_matches_eager(fn, torch.randn(3, 4))


def _overlaps(a, b):
    return a.numel() and b.numel() and a.data_ptr() < b.data_ptr() + b.nbytes and b.data_ptr() < a.data_ptr() + a.nbytes


# Results that IREE folds to an argument (no computation left) or to another result (CSE).
FOLDED_RESULTS = [
    pytest.param(lambda x: (x.clone(),), id="clone"),
    pytest.param(lambda x: (x.unsqueeze(0).clone(),), id="reshaped_clone"),
    pytest.param(lambda x: (x.to(torch.float32).clone(),), id="same_dtype_clone"),
    pytest.param(lambda x: (torch.cat([x]),), id="cat_of_one"),
    pytest.param(lambda x: (torch.where(torch.tensor(True), x, x * 2),), id="where_constant"),
    pytest.param(lambda x: (x * 2, x * 2), id="equal_results"),
    pytest.param(lambda x: (x * 2, (x * 2).reshape(-1)), id="equal_results_reshaped"),
]


@pytest.mark.parametrize("fn", FOLDED_RESULTS)
def test_results_own_their_memory_like_eager(fn):
    x = torch.randn(3, 4)
    compiled = _compile(fn)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(x)
    _assert_all_compiled(count)
    torch.testing.assert_close(actual, fn(x))
    # Eager returns fresh tensors here: no result shares memory with the input or another result.
    tensors = [x, *actual]
    for i, a in enumerate(tensors):
        for b in tensors[:i]:
            assert not _overlaps(a, b)


class _ReturnsItsParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.scale.clone(), x * self.scale


def test_a_result_folded_to_a_parameter_owns_its_memory():
    model = _ReturnsItsParameter()
    compiled = _compile(model)
    x = torch.randn(3, 4)
    with torch.no_grad(), count_graphs() as count:
        for _ in range(2):  # the second call reuses the parameter's imported buffer
            scale, _ = compiled(x)
            torch.testing.assert_close(scale, model.scale)
            assert not _overlaps(scale, model.scale)
    _assert_all_compiled(count, graphs=1)


# --- in-place updates -----------------------------------------------------


def _in_place_then_compute(x, y):
    x.add_(1)
    y[0].mul_(3)
    return x * y


def test_in_place_updates_of_inputs_reach_the_caller():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    eager_x, eager_y = x.clone(), y.clone()
    expected = _in_place_then_compute(eager_x, eager_y)
    compiled = _compile(_in_place_then_compute)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(x, y)
    _assert_all_compiled(count)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(x, eager_x)
    torch.testing.assert_close(y, eager_y)


def test_in_place_update_of_a_non_contiguous_input():
    def fn(x):
        x.mul_(2)
        return x.sum()

    base = torch.randn(4, 6)
    eager_base = base.clone()
    expected = fn(eager_base[:, ::2])
    compiled = _compile(fn)
    with torch.no_grad(), count_graphs() as count:
        actual = compiled(base[:, ::2])
    _assert_all_compiled(count)
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(base, eager_base)


def test_in_place_update_of_an_integer_input_returning_it():
    def fn(counter, x):
        counter.add_(x.shape[0])
        return counter

    counter, eager_counter = torch.tensor([5]), torch.tensor([5])
    compiled = _compile(fn)
    x = torch.randn(3)
    with torch.no_grad(), count_graphs() as count:
        for _ in range(3):
            actual = compiled(counter, x)
            fn(eager_counter, x)
    _assert_all_compiled(count)
    assert actual is counter
    torch.testing.assert_close(counter, eager_counter)


def test_batch_norm_running_stats_follow_eager_in_training():
    eager = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model.load_state_dict(eager.state_dict())
    compiled = _compile(model)
    with torch.no_grad(), count_graphs() as count:
        for step in range(3):
            x = torch.randn(2, 3, 6, 6)
            torch.testing.assert_close(compiled(x), eager(x), msg=lambda m: f"step {step}: {m}")
    _assert_all_compiled(count, graphs=1)
    for name, buffer in eager[1].named_buffers():
        torch.testing.assert_close(getattr(model[1], name), buffer, msg=lambda m: f"{name}: {m}")


def test_batch_norm_training_with_grad_updates_buffers_and_grads():
    eager = torch.nn.BatchNorm1d(5)
    model = torch.nn.BatchNorm1d(5)
    compiled = _compile(model)
    with count_graphs() as count:
        for _ in range(2):
            x = torch.randn(4, 5)
            compiled(x).pow(2).sum().backward()
            eager(x).pow(2).sum().backward()
    _assert_all_compiled(count, graphs=2)
    for name, buffer in eager.named_buffers():
        torch.testing.assert_close(getattr(model, name), buffer)
    torch.testing.assert_close(model.weight.grad, eager.weight.grad)
    torch.testing.assert_close(model.bias.grad, eager.bias.grad)


_IN_PLACE_IN_IREE = {
    "index_add": lambda x, i, s: torch.index_add(x, 0, i, s),
    "index_copy": lambda x, i, s: torch.index_copy(x, 0, i, s),
    "scatter_add": lambda x, i, s: torch.scatter_add(x, 0, i.view(-1, 1).expand(-1, 3), s),
    "index_put": lambda x, i, s: torch.index_put(x, (i,), s),
    "sort": lambda x, i, s: torch.sort(x, dim=0).values + 0 * s.sum(),
}


@pytest.mark.parametrize("name", sorted(_IN_PLACE_IN_IREE))
def test_ops_updating_in_place_in_iree_leave_the_callers_tensors_alone(name):
    """IREE may fold a scatter's destination onto an argument's buffer and write into
    the caller's tensor: those arguments are passed as copies."""
    fn = _IN_PLACE_IN_IREE[name]
    x, index, source = torch.randn(5, 3), torch.tensor([0, 2, 4]), torch.randn(3, 3)
    before = x.clone()
    with count_graphs() as count:
        compiled = torch.compile(fn, backend="tori", options={"fallback": "error"})
        result = compiled(x, index, source)
    assert count.compiled_graphs == 1 and count.compiled_calls == 1
    torch.testing.assert_close(result, fn(before, index, source))
    assert torch.equal(x, before), f"{name} changed its input"
    assert ArgKind.WRITTEN_TENSOR in last_compile().forward.compiled.signature.args
