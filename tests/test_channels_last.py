"""tori.frontend.channels_last: NHWC -> NCHW permutes moved below elementwise ops and
cancelled against the permutes back, on traced ATen graphs, values checked."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tori.frontend.channels_last import TO_NCHW, TO_NHWC, sink_channel_permutes

aten = torch.ops.aten


def _permutes(gm) -> list[list[int]]:
    return [list(n.args[1]) for n in gm.graph.nodes if n.target is aten.permute.default]


def _sunk(fn, *args):
    gm = make_fx(fn, tracing_mode="fake")(*args)
    expected = fn(*args)
    removed = sink_channel_permutes(gm)
    gm.graph.lint()
    gm.recompile()
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)
    return gm, removed


def test_a_chain_of_elementwise_ops_between_two_permutes_keeps_none():
    def fn(rows, bias, gate):
        x = rows.permute(TO_NCHW) + bias.reshape(1, -1, 1, 1)       # [1, 8, 5, 6] from NHWC
        x = torch.sigmoid(x) * 3.0
        x = x * gate                                                # a squeeze-excitation gate, [1, 8, 1, 1]
        return torch.clamp(torch.round(x * 4.0), -128, 127).to(torch.int8).permute(TO_NHWC)

    gm, removed = _sunk(fn, torch.randn(1, 5, 6, 8), torch.randn(8), torch.randn(1, 8, 1, 1))
    assert removed == 1
    # left: the broadcast operands (bias and gate, [1, 8, 1, 1]) as [1, 1, 1, 8]
    assert _permutes(gm) == [TO_NHWC, TO_NHWC], gm.code


def test_a_value_read_in_nchw_elsewhere_keeps_one_shared_permute():
    def fn(rows):
        x = torch.relu(rows.permute(TO_NCHW))
        return x.permute(TO_NHWC) * 2, x.sum(2), x + 1

    gm, removed = _sunk(fn, torch.randn(2, 4, 3, 5))
    assert removed == 1
    # relu runs on NHWC values; its NCHW form, read by the sum and the add, is one
    # permute (the add moved below it keeps its own for the graph's output)
    assert _permutes(gm) == [TO_NCHW, TO_NCHW], gm.code


def test_a_spatial_mean_moves_and_a_full_nchw_operand_stops_the_move():
    def fn(rows, other):
        x = rows.permute(TO_NCHW)
        pooled = x.mean((2, 3), keepdim=True)          # moves: a mean over NHWC's H and W
        return pooled.permute(TO_NHWC), (x + other)    # other is NCHW of full size: stays

    gm, removed = _sunk(fn, torch.randn(1, 4, 4, 6), torch.randn(1, 6, 4, 4))
    assert removed == 1
    means = [n for n in gm.graph.nodes if n.target is aten.mean.dim]
    assert [list(n.args[1]) for n in means] == [[1, 2]], gm.code
    assert any(n.target is aten.add.Tensor and n.args[0].target is aten.permute.default for n in gm.graph.nodes)


def test_a_move_given_up_leaves_no_permute_behind():
    def fn(rows, mask, gate):
        # the full NCHW mask stops the move, after the gate's permute was made for it
        return torch.where(mask, rows.permute(TO_NCHW), gate)

    gm, removed = _sunk(fn, torch.randn(1, 3, 4, 5), torch.rand(1, 5, 3, 4) > 0.5, torch.randn(1, 5, 1, 1))
    assert removed == 0 and _permutes(gm) == [TO_NCHW], gm.code
