"""Random ops in compiled graphs draw from a seed that the runtime takes from torch's
default generator on every call (frontend/seeded_random.py, runtime/seed.py): calls
differ, torch.manual_seed reproduces them, dropout's backward sees its forward's mask,
and large samples keep their distributions. Graphs without random ops are unchanged."""

import numpy as np
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tori
from tori.frontend.importer import import_graph
from tori.frontend.signature import ArgKind
from tori.testing import count_graphs

N = 200_000


def _samples(x):
    return (
        torch.rand(N) + x,
        torch.randn(N, dtype=torch.float64),
        torch.randint(3, 13, (N,)),
        torch.bernoulli(torch.full((N,), 0.3)),
        torch.empty(N).uniform_(-1.0, 3.0),
        torch.empty(N).exponential_(2.0),
    )


def test_calls_differ_manual_seed_reproduces_and_distributions_hold():
    compiled = torch.compile(_samples, backend="tori", options={"fallback": "error"})
    x = torch.zeros(())
    with count_graphs() as count:
        calls = [compiled(x) for _ in range(4)]  # the first calls also time the drivers, each its own module
        torch.manual_seed(1234)
        first = compiled(x)
        torch.manual_seed(1234)
        again = compiled(x)
    assert count.compiled_graphs == 1 and count.compiled_calls == 6, count.delta
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    for i in range(len(calls)):
        for j in range(i):
            assert not torch.equal(calls[i][0], calls[j][0]), f"calls {j} and {i} drew the same numbers"
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], calls[-1][0])

    uniform, normal, integers, coin, shifted, exponential = first
    assert uniform.dtype == torch.float32 and 0 <= uniform.min() and uniform.max() < 1
    # Tolerances are about 5 standard errors.
    assert abs(uniform.mean() - 0.5) < 0.0035 and abs(uniform.var() - 1 / 12) < 0.0015
    assert normal.dtype == torch.float64
    assert abs(normal.mean()) < 0.012 and abs(normal.var() - 1) < 0.016
    assert abs(torch.quantile(normal, 0.975) - 1.96) < 0.03
    assert integers.dtype == torch.int64 and integers.min() == 3 and integers.max() == 12
    counts = torch.bincount(integers - 3, minlength=10).double() / N
    assert (counts - 0.1).abs().max() < 0.004
    assert set(coin.unique().tolist()) == {0.0, 1.0} and abs(coin.mean() - 0.3) < 0.006
    assert -1 <= shifted.min() and shifted.max() < 3 and abs(shifted.mean() - 1) < 0.015
    assert exponential.min() >= 0 and abs(exponential.mean() - 0.5) < 0.006


def test_dropout_backward_uses_the_forward_mask():
    p = 0.4
    linear = torch.nn.Linear(64, 64)

    def step(x):
        return torch.nn.functional.dropout(linear(x), p, training=True)

    compiled = torch.compile(step, backend="tori", options={"fallback": "error"})
    x = torch.randn(256, 64, requires_grad=True)
    grad_out = torch.randn(256, 64)
    masks = []
    with count_graphs() as count:
        for seed in (5, 6, 5):
            torch.manual_seed(seed)
            out = compiled(x)
            out.backward(grad_out)
            kept = out != 0
            # Kept values are the linear output scaled by 1/(1-p); dropped ones are zero.
            with torch.no_grad():
                torch.testing.assert_close(out[kept], linear(x)[kept] / (1 - p))
                # d out / d(linear out) = mask / (1 - p): the bias gradient sums it.
                torch.testing.assert_close(linear.bias.grad, (grad_out * kept / (1 - p)).sum(0))
            linear.zero_grad()
            x.grad = None
            masks.append(kept)
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0 and count.fallback_calls == 0, count.delta
    assert count.compiled_calls == 6, count.delta  # forward and backward, three times
    assert torch.equal(masks[0], masks[2]) and not torch.equal(masks[0], masks[1])
    assert abs(masks[1].double().mean() - (1 - p)) < 0.02


def _signature(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    module, signature = import_graph(gm, graph_name="g")
    return str(module), signature


def test_only_graphs_with_random_ops_take_a_seed():
    text, signature = _signature(lambda x: x * 2, torch.ones(3))
    assert signature.args == (ArgKind.TENSOR,)
    assert "si64" not in text
    text, signature = _signature(lambda x: torch.ops.aten.native_dropout(x, 0.5, True)[0] + torch.randn_like(x),
                                 torch.ones(3))
    assert signature.args == (ArgKind.TENSOR, ArgKind.SEED)
    assert "%arg1: !torch.vtensor<[],si64>" in text
    assert "aten.rand" not in text and "aten.native_dropout" not in text and "aten.bernoulli" not in text


class _Noisy(torch.nn.Module):
    def forward(self, x):
        return x + torch.rand(1000)


def test_exported_random_entry_point_takes_a_seed(tmp_path):
    path = tori.export(_Noisy(), (torch.zeros(1000),), output_dir=tmp_path / "noisy", examples=False)
    artifact = tori.runtime.load(path)
    entry = artifact["forward"]
    assert entry.spec["seed"] == {"dtype": "int64", "shape": [], "position": 1}
    assert artifact.manifest["format_version"] == 2
    x = np.zeros(1000, np.float32)
    first, second = entry(x), entry(x)
    assert not np.array_equal(first, second) and 0 <= first.min() and first.max() < 1
    np.testing.assert_array_equal(entry(x, seed=7), entry(x, seed=7))
    artifact.manual_seed(3)
    drawn = entry(x)
    artifact.manual_seed(3)
    np.testing.assert_array_equal(entry(x), drawn)
