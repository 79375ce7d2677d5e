"""Scratch memory (runtime/scratch.py): CPU modules run in this process take the
buffer of their intermediate values as an argument, lent by a pool per device and
reused call after call, so that a call touches no fresh heap pages."""

import resource

import iree.runtime as rt
import pytest
import torch

import tori
import tori.compiler as tc
from tori.runtime import devices
from tori.runtime.scratch import ScratchPool
from tori.testing import count_graphs


def _wide(x, w1, w2):
    # [4096, 4096] float32 between the matmuls: 64 MB of intermediate values, above
    # glibc's largest mmap threshold (32 MB), so a fresh mapping per call without scratch.
    return (x @ w1).relu() @ w2


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _module(graph):
    return graph._modules[graph.driver or "local-sync"]


def test_calls_reuse_one_scratch_buffer_and_touch_no_fresh_pages():
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(4096, 64), torch.randn(64, 4096) / 8, torch.randn(4096, 64) / 64
    compiled = torch.compile(_wide, backend="tori", options={"fallback": "error", "driver": "local-sync"})
    with count_graphs() as count:
        first = compiled(x, w1, w2)
        module = _module(tori.last_compile().forward.compiled)
        assert module.scratch is not None and module.scratch.size >= 4096 * 4096 * 4
        before = _faults()
        for _ in range(4):
            latest = compiled(x, w1, w2)
        faults_per_call = (_faults() - before) / 4
    assert count.compiled_calls == 5 and count.fallback_calls == 0
    expected = _wide(x, w1, w2)
    torch.testing.assert_close(first, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(latest, expected, rtol=1e-4, atol=1e-4)
    # 64 MB of fresh pages would be 16,384 faults per call.
    assert faults_per_call < 1000, f"{faults_per_call:.0f} page faults per call"
    assert devices.scratch_pool(module.driver, module.device).held_bytes() >= module.scratch.size


def test_results_do_not_live_in_the_scratch_buffer():
    compiled = torch.compile(lambda a, b: ((a @ b).sin() @ b.T).cos(), backend="tori",
                             options={"fallback": "error", "driver": "local-sync"})
    a1, a2, b = torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 48)
    r1 = compiled(a1, b)
    kept = r1.clone()
    r2 = compiled(a2, b)
    assert _module(tori.last_compile().forward.compiled).scratch is not None
    torch.testing.assert_close(r1, kept, rtol=0, atol=0)  # the second call wrote no result of the first
    torch.testing.assert_close(r2, ((a2 @ b).sin() @ b.T).cos(), rtol=1e-5, atol=1e-5)


def test_dynamic_shapes_ask_the_module_for_each_calls_scratch_size():
    fn = lambda t: (t @ t.T).softmax(-1) @ t  # noqa: E731
    compiled = torch.compile(fn, backend="tori", dynamic=True, options={"fallback": "error", "driver": "local-sync"})
    with count_graphs() as count:
        for rows in (8, 300, 40, 1000, 16):
            t = torch.randn(rows, 16)
            torch.testing.assert_close(compiled(t), fn(t), rtol=1e-4, atol=1e-4)
    assert count.compiled_graphs == 1 and count.compiled_calls == 5 and count.fallback_calls == 0
    graph = tori.last_compile().forward.compiled
    module = _module(graph)
    assert module.scratch is not None and module.scratch.size is None  # no constant: shapes decide
    # The 1000 x 1000 scores need the most; what the module answers grows with the rows.
    sizes = [graph.scratch_bytes([rows, rows, torch.randn(rows, 16)]) for rows in (8, 300, 1000)]
    assert sizes == sorted(sizes) and sizes[-1] >= 1000 * 1000 * 4
    assert devices.scratch_pool(module.driver, module.device).held_bytes() >= sizes[-1]


def test_reset_frees_the_scratch_buffers():
    compiled = torch.compile(lambda a: (a @ a.T).exp() @ a, backend="tori", options={"fallback": "error"})
    compiled(torch.randn(128, 64))
    assert any(pool.held_bytes() for pool in devices._scratch.values())
    tc.reset()
    assert devices._scratch == {}


def test_exported_modules_keep_the_plain_calling_convention(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    x = torch.randn(8, 16)
    with torch.no_grad():
        out = tori.export(model, (x,), output_dir=tmp_path / "artifact")
        expected = model(x)
    instance = rt.VmInstance()
    names = rt.VmModule.copy_buffer(instance, (out / "cpu.vmfb").read_bytes()).function_names
    assert not any(name.endswith("_transients_size") for name in names), names
    torch.testing.assert_close(torch.from_numpy(tori.runtime.load(out)(x.numpy())), expected, rtol=1e-5, atol=1e-5)


def test_both_host_drivers_run_on_one_pools_buffer():
    tc.reset()
    fn = lambda a, b: ((a @ b).sin() @ b.T).cos()  # noqa: E731
    compiled = torch.compile(fn, backend="tori", options={"fallback": "error", "driver": "auto"})
    a, b = torch.randn(96, 32), torch.randn(32, 80)
    with count_graphs() as count:
        for _ in range(16):  # the driver trial's 12 calls alternate local-sync and local-task
            torch.testing.assert_close(compiled(a, b), fn(a, b), rtol=1e-5, atol=1e-5)
    assert count.compiled_calls == 16 and count.fallback_calls == 0
    assert set(tori.last_compile().forward.compiled._timings) == {"local-sync", "local-task"}
    (pool,) = devices._scratch.values()
    assert len(pool._free) == 1  # one call at a time: one buffer, whichever driver ran


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_a_too_small_pool_buffer_is_replaced_not_passed(driver):
    # A pool of its own: the device's shared pool may hold a buffer of an earlier test.
    pool = ScratchPool(devices.device(driver))
    small = pool.take(1024)
    pool.give(small)
    large = pool.take(1 << 20)
    assert large[0] >= 1 << 20 and large[1] is not small[1]
    pool.give(large)
    assert pool.take(4096)[1] is large[1]  # the larger one serves smaller requests
    # The host drivers share one pool: a graph timed on both keeps one buffer.
    assert devices.scratch_pool("local-sync", devices.device("local-sync")) is \
        devices.scratch_pool("local-task", devices.device("local-task"))


def test_a_module_iree_cannot_give_scratch_allocates_its_own_and_runs_compiled():
    def mask_assign(x):
        y = x.clone()
        y[x > 0] = 0.0  # a boolean mask's index_put: transients sized by the values
        return y

    compiled = torch.compile(mask_assign, backend="tori", options={"fallback": "error", "cache": False})
    x = torch.randn(6, 7)
    with count_graphs() as count:
        torch.testing.assert_close(compiled(x), mask_assign(x))
        torch.testing.assert_close(compiled(x), mask_assign(x))
    assert count.compiled_calls == 2 and count.fallback_calls == 0
    record = tori.last_compile().graphs[0]
    assert _module(record.compiled).scratch is None
    assert "--iree-torch-externalize-transients" not in record.stages["iree"]  # the command that made it
