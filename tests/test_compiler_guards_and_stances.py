"""tori.compiler's guard filters, stances and `disable`, through real tori compiles:
what each one changes in recompilation, and what a dropped guard makes unsafe."""

import sys

import pytest
import torch

import tori
from tori.errors import OptionsError
from tori.testing import count_graphs

tc = tori.compiler

# A module-level scalar: Dynamo bakes its value into the graph and guards on it.
SCALE = 2.0


class Scaled(torch.nn.Module):
    """A user-defined module holding an inbuilt one: Dynamo guards on attributes of both."""

    def __init__(self):
        super().__init__()
        self.act = torch.nn.LeakyReLU(0.1)
        self.scale = 2.0

    def forward(self, x):
        return self.act(x) * self.scale


def _times(x, n):
    return x * n


def _times_global(x):
    return x * SCALE


def _affine(x):
    return x * 2 + 1


def _compile(fn, guard_filter=None, dynamic=False):
    # fallback='error': a graph that ran in eager PyTorch must not pass for a compiled one.
    options = {"fallback": "error"}
    if guard_filter is not None:
        options["guard_filter_fn"] = guard_filter
    return tc.compile(fn, options=options, dynamic=dynamic)


def _run(fn, calls, guard_filter=None):
    """Compile `fn` afresh, run `calls(compiled)`; return its result and the counts.

    Every call must have run compiled: a guard filter must never turn into a fallback."""
    torch._dynamo.reset()
    compiled = _compile(fn, guard_filter)
    with count_graphs() as count:
        result = calls(compiled)
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    return result, count


def _assert_calls_compiled(count, calls):
    assert count.compiled_calls == calls and count.fallback_calls == 0, count.delta


def _keep_tensor_and_parameter_guards(entries):
    return tc.keep_tensor_guards_unsafe(entries, keep_parameters=True)


# --- guard filters -------------------------------------------------------------------


def test_keep_portable_guards_drops_python_scalar_guards_and_keeps_grad_mode():
    x = torch.ones(3)

    def new_scalar(compiled):
        compiled(x, 2)
        return compiled(x, 3)

    result, count = _run(_times, new_scalar)
    assert count.compiled_graphs == 2  # the int is a constant of the graph, guarded
    torch.testing.assert_close(result, x * 3)

    result, count = _run(_times, new_scalar, tc.keep_portable_guards_unsafe)
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 2)
    # Unsafe: the graph compiled for n=2 serves n=3.
    torch.testing.assert_close(result, x * 2)

    # Kept: the global state (grad mode here) and local tensors' metadata.
    w = torch.ones(3, requires_grad=True)

    def grad_then_no_grad(compiled):
        compiled(x, w)
        with torch.no_grad():
            return compiled(x, w)

    result, count = _run(_times, grad_then_no_grad, tc.keep_portable_guards_unsafe)
    assert count.compiled_graphs == 2
    assert not result.requires_grad


def test_keep_tensor_guards_drops_the_grad_mode_guard():
    x, w = torch.ones(3), torch.full((3,), 2.0, requires_grad=True)

    def grad_then_no_grad(compiled):
        compiled(x, w)
        with torch.no_grad():
            return compiled(x, w)

    result, count = _run(_times, grad_then_no_grad)
    assert count.compiled_graphs == 2
    assert not result.requires_grad

    result, count = _run(_times, grad_then_no_grad, tc.keep_tensor_guards_unsafe)
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 2)
    # Unsafe: the training graph runs under no_grad and still records autograd history.
    assert result.requires_grad
    torch.testing.assert_close(result.detach(), x * w.detach())

    # Kept: the metadata of tensors that are not parameters.
    def new_shape(compiled):
        compiled(x, w)
        return compiled(torch.ones(5), torch.ones(5, requires_grad=True))

    result, count = _run(_times, new_shape, tc.keep_tensor_guards_unsafe)
    assert count.compiled_graphs == 2
    assert result.shape == (5,)


@pytest.mark.parametrize("guard_filter, recompiles", [
    (None, True),
    (tc.keep_tensor_guards_unsafe, False),
    (_keep_tensor_and_parameter_guards, True),
], ids=["no filter", "keep_tensor_guards", "keep_parameters=True"])
def test_keep_tensor_guards_guards_parameters_only_with_keep_parameters(guard_filter, recompiles):
    x = torch.ones(3)
    p = torch.nn.Parameter(torch.full((3,), 2.0), requires_grad=False)

    def parameter_starts_requiring_grad(compiled):
        compiled(x, p)
        p.requires_grad_(True)
        return compiled(x, p)

    result, count = _run(_times, parameter_starts_requiring_grad, guard_filter)
    _assert_calls_compiled(count, 2)
    torch.testing.assert_close(result.detach(), x * 2)
    if recompiles:
        assert count.compiled_graphs == 2
        assert result.requires_grad
    else:
        # Unsafe: the inference graph serves the call; the gradient to p is silently lost.
        assert count.compiled_graphs == 1
        assert not result.requires_grad


def test_skip_guard_on_inbuilt_nn_modules_drops_torch_nn_attribute_guards():
    x = -torch.ones(3)
    module = Scaled()

    # Attributes are set on `module`: the compiled wrapper does not forward setattr.
    def new_slope(compiled):
        module.act.negative_slope, module.scale = 0.1, 2.0
        compiled(x)
        module.act.negative_slope = 0.5
        return compiled(x)

    result, count = _run(module, new_slope)
    assert count.compiled_graphs == 2
    torch.testing.assert_close(result, x * 0.5 * 2)

    result, count = _run(module, new_slope, tc.skip_guard_on_inbuilt_nn_modules_unsafe)
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 2)
    # Unsafe: the LeakyReLU's new slope is not seen; the result is the one for 0.1.
    torch.testing.assert_close(result, x * 0.1 * 2)

    # Kept: attributes of user-defined modules.
    def new_scale(compiled):
        module.act.negative_slope, module.scale = 0.1, 2.0
        compiled(x)
        module.scale = 3.0
        return compiled(x)

    result, count = _run(module, new_scale, tc.skip_guard_on_inbuilt_nn_modules_unsafe)
    assert count.compiled_graphs == 2
    torch.testing.assert_close(result, x * 0.1 * 3)


def test_skip_guard_on_all_nn_modules_drops_user_module_attribute_guards():
    x = -torch.ones(3)
    module = Scaled()

    def new_scale_then_new_slope(compiled):
        module.act.negative_slope, module.scale = 0.1, 2.0
        compiled(x)
        module.scale = 3.0
        scaled = compiled(x)
        module.act.negative_slope = 0.5
        return scaled, compiled(x)

    (scaled, sloped), count = _run(module, new_scale_then_new_slope)
    assert count.compiled_graphs == 3
    torch.testing.assert_close(scaled, x * 0.1 * 3)
    torch.testing.assert_close(sloped, x * 0.5 * 3)

    (scaled, sloped), count = _run(module, new_scale_then_new_slope, tc.skip_guard_on_all_nn_modules_unsafe)
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 3)
    # Unsafe: neither the user module's scale nor the inbuilt module's slope is seen.
    torch.testing.assert_close(scaled, x * 0.1 * 2)
    torch.testing.assert_close(sloped, x * 0.1 * 2)


def test_skip_guard_on_globals_drops_the_guard_on_a_global(monkeypatch):
    x = torch.ones(3)
    this_module = sys.modules[__name__]

    def new_global(compiled):
        monkeypatch.setattr(this_module, "SCALE", 2.0)
        compiled(x)
        monkeypatch.setattr(this_module, "SCALE", 5.0)
        return compiled(x)

    result, count = _run(_times_global, new_global)
    assert count.compiled_graphs == 2
    torch.testing.assert_close(result, x * 5)

    result, count = _run(_times_global, new_global, tc.skip_guard_on_globals_unsafe)
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 2)
    # Unsafe: the changed global is not seen; the result is the stale one.
    torch.testing.assert_close(result, x * 2)

    # Kept: guards on the arguments, here a new static shape.
    def new_shape(compiled):
        compiled(x)
        return compiled(torch.ones(5))

    result, count = _run(_times_global, new_shape, tc.skip_guard_on_globals_unsafe)
    assert count.compiled_graphs == 2
    assert result.shape == (5,)


def test_skip_all_guards_reuses_the_first_graph_for_any_input():
    x = torch.ones(3)

    def new_scalar(compiled):
        compiled(x, 2)
        return compiled(x, 3)

    result, count = _run(_times, new_scalar)
    assert count.compiled_graphs == 2
    torch.testing.assert_close(result, x * 3)

    def new_scalar_then_new_shape(compiled):
        compiled(x, 2)
        stale = compiled(x, 3)
        with pytest.raises((ValueError, RuntimeError), match="shape"):
            compiled(torch.ones(5), 2)
        return stale

    result, count = _run(_times, new_scalar_then_new_shape, tc.skip_all_guards_unsafe)
    assert count.compiled_graphs == 1
    # Unsafe: a new scalar gets the stale result; a new shape reaches the graph compiled
    # for the old one, which rejects it at the call instead of recompiling.
    torch.testing.assert_close(result, x * 2)


# --- stances ------------------------------------------------------------------------


def test_force_eager_runs_a_compiled_function_eagerly():
    compiled = _compile(_affine)
    x = torch.arange(3.0)
    with tc.set_stance("force_eager"), count_graphs() as count:
        torch.testing.assert_close(compiled(x), _affine(x))
    assert count.compiled_graphs == 0 and count.compiled_calls == 0 and count.fallback_calls == 0

    # The stance ends with the block.
    with count_graphs() as count:
        torch.testing.assert_close(compiled(x), _affine(x))
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 1)


def test_default_stance_as_a_decorator_compiles_inside_force_eager():
    compiled = _compile(_affine)
    x = torch.arange(3.0)

    @tc.set_stance("default")
    def call_compiled(t):
        return compiled(t)

    with tc.set_stance("force_eager"), count_graphs() as count:
        compiled(x)
        torch.testing.assert_close(call_compiled(x), _affine(x))
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 1)


def test_eager_on_recompile_runs_new_shapes_eagerly_and_cached_ones_compiled():
    compiled = _compile(_affine, dynamic=False)
    x, wider = torch.arange(3.0), torch.arange(5.0)
    compiled(x)
    with tc.set_stance("eager_on_recompile"), count_graphs() as count:
        torch.testing.assert_close(compiled(wider), _affine(wider))
        torch.testing.assert_close(compiled(x), _affine(x))
    assert count.compiled_graphs == 0
    _assert_calls_compiled(count, 1)  # the cached shape only

    with count_graphs() as count:
        compiled(wider)
    assert count.compiled_graphs == 1


def test_fail_on_recompile_raises_for_any_compile():
    compiled = _compile(_affine, dynamic=False)
    x = torch.arange(3.0)
    compiled(x)
    with tc.set_stance("fail_on_recompile"), count_graphs() as count:
        torch.testing.assert_close(compiled(x), _affine(x))
        with pytest.raises(RuntimeError, match="fail_on_recompile") as raised:
            compiled(torch.arange(5.0))
    assert "size mismatch" in str(raised.value)  # the failing guard is named
    assert count.compiled_graphs == 0
    _assert_calls_compiled(count, 1)

    # Torch counts the first compile of a frame as a recompile too.
    torch._dynamo.reset()
    with tc.set_stance("fail_on_recompile"), pytest.raises(RuntimeError, match="fail_on_recompile"):
        compiled(x)


@pytest.fixture
def fresh_stance_examples(monkeypatch):
    # The *_then_compile stances keep each code location's first inputs across
    # torch._dynamo.reset(): without this, only a process's first run sees the eager call.
    monkeypatch.setattr(torch._dynamo.eval_frame, "_EXAMPLE_INPUTS", None)


def test_eager_then_compile_runs_the_first_call_eagerly(fresh_stance_examples):
    compiled = _compile(_affine, dynamic=None)
    counts = []

    @tc.set_stance("eager_then_compile")
    def call(n):
        x = torch.arange(float(n))
        with count_graphs() as count:
            torch.testing.assert_close(compiled(x), _affine(x))
        counts.append((count.compiled_graphs, count.compiled_calls))

    for n in (3, 5, 7):
        call(n)
    # Eager first; then one graph, dynamic because the first two sizes differed.
    assert counts == [(0, 0), (1, 1), (0, 1)]


def test_aot_eager_then_compile_serves_the_first_inputs_with_aot_eager(fresh_stance_examples):
    compiled = _compile(_affine, dynamic=None)
    counts = []
    with tc.set_stance("aot_eager_then_compile"):
        for n in (3, 3, 5, 7):
            x = torch.arange(float(n))
            with count_graphs() as count:
                torch.testing.assert_close(compiled(x), _affine(x))
            counts.append((count.compiled_graphs, count.compiled_calls))
    # The aot_eager graph of the first call stays cached: the same input keeps using it.
    # The first input that fails its guards compiles with tori, with dynamic shapes.
    assert counts == [(0, 0), (0, 0), (1, 1), (0, 1)]


def test_unknown_stance_names_the_valid_ones():
    with pytest.raises(OptionsError) as raised:
        tc.set_stance("eager")
    assert raised.value.what == "stance"
    assert all(stance in str(raised.value) for stance in tc.STANCES)
    assert len(tc.STANCES) == 6


# --- disable ------------------------------------------------------------------------


def test_disabled_helper_runs_eagerly_between_two_compiled_graphs():
    compiling_inside = []

    @tc.disable
    def helper(t):
        compiling_inside.append(torch.compiler.is_compiling())
        return t + 1

    def fn(x):
        return helper(x.sin()).cos()

    compiled = _compile(fn)
    x = torch.arange(3.0)
    with count_graphs() as count:
        for _ in range(2):
            torch.testing.assert_close(compiled(x), fn(x))
    assert compiling_inside == [False] * 4  # two compiled calls, two eager references
    assert count.compiled_graphs == 2  # before and after the helper
    _assert_calls_compiled(count, 4)


def test_disable_wins_over_compile_only_when_applied_last():
    x = torch.arange(3.0)
    with count_graphs() as count:
        torch.testing.assert_close(tc.disable(_compile(_affine))(x), _affine(x))
    assert count.compiled_graphs == 0 and count.compiled_calls == 0

    # Both wrappers unwrap to the innermost function: compiling a disabled function
    # compiles it.
    with count_graphs() as count:
        torch.testing.assert_close(_compile(tc.disable(_affine))(x), _affine(x))
    assert count.compiled_graphs == 1
    _assert_calls_compiled(count, 1)


def _inner(y):
    return y.sin() + 1


def _outer(y):
    return _inner(y) * 2 + _inner(y)


@pytest.mark.parametrize("recursive, graphs, calls", [(True, 0, 0), (False, 1, 2)])
def test_disable_recursive_false_compiles_the_functions_called(recursive, graphs, calls):
    disabled = tc.disable(_outer, recursive=recursive)
    compiled = _compile(lambda y: disabled(y))
    x = torch.arange(3.0)
    with count_graphs() as count:
        torch.testing.assert_close(compiled(x), _outer(x))
    # recursive=False: _outer's own code runs eagerly, each call of _inner is a
    # compiled frame (one graph, called twice).
    assert count.compiled_graphs == graphs
    _assert_calls_compiled(count, calls)
