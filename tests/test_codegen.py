"""Code generation per op family (tori/targets/codegen.py): which rules a graph gets,
that they reach iree-compile and the cache key, that the user's flags win, and that
graphs compiled with each strategy match eager."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tori
from tori.cache import compile_key
from tori.config import Codegen, Options
from tori.errors import OptionsError
from tori.targets import Target
from tori.passes.packed_matmul import PACKED_MIN_ROWS, tile_rows
from tori.targets.codegen import Family, choose, op_families
from tori.targets.cpu import cpu_features
from tori.testing import assert_matches_eager, count_graphs


class _Mixed(nn.Module):
    """A 3x3 convolution, a depthwise one and a linear layer; on 56x56 images the
    first is 0.107 GFLOP, above the convolution rule's least work."""

    def __init__(self, inputs: int = 32):
        super().__init__()
        self.conv = nn.Conv2d(inputs, 64, 3)
        self.depthwise = nn.Conv2d(64, 64, 3, groups=64)
        self.linear = nn.Linear(64, 5)

    def forward(self, x):
        return self.linear(F.adaptive_avg_pool2d(self.depthwise(F.relu(self.conv(x))), 1).flatten(1))


class _AsTuple(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return (self.module(*args),)


def _aten_graph(module: nn.Module, *args) -> torch.fx.GraphModule:
    """The functional ATen graph that AOTAutograd makes of `module`, as tori sees it."""
    from torch._functorch.aot_autograd import aot_export_module

    gm, _ = aot_export_module(_AsTuple(module), args, trace_joint=False)
    return gm


def _mixed_graph(inputs: int = 32):
    torch.manual_seed(0)
    model = _Mixed(inputs).eval()
    with torch.no_grad():
        return _aten_graph(model, torch.randn(1, inputs, 56, 56))


def test_op_families_counts_ops_and_work():
    uses = {u.family: u for u in op_families(_mixed_graph())}
    assert set(uses) == {Family.CONV2D, Family.GROUPED_CONV, Family.MATMUL}
    assert (uses[Family.CONV2D].ops, uses[Family.GROUPED_CONV].ops, uses[Family.MATMUL].ops) == (1, 1, 1)
    # 2 x (64 channels x 54 x 54 outputs) x (32 x 3 x 3) multiply-adds
    assert uses[Family.CONV2D].gflop == pytest.approx(2 * 64 * 54 * 54 * 288 / 1e9)
    assert uses[Family.GROUPED_CONV].gflop == pytest.approx(2 * 64 * 52 * 52 * 9 / 1e9)
    assert uses[Family.MATMUL].gflop == pytest.approx(2 * 5 * 64 / 1e9)


class _ConvTokens(nn.Module):
    """A 3x3 convolution (0.107 GFLOP on 56x56 images) whose 2916 positions then go
    through a linear layer as tokens (0.024 GFLOP): both above their rules' least work."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 64, 3)
        self.linear = nn.Linear(64, 64)

    def forward(self, x):
        return self.linear(self.conv(x).flatten(2).transpose(1, 2))


def test_convolution_graph_gets_channels_last_convolutions_and_data_tiling():
    strategy = choose(_mixed_graph(), Options(cpu="skylake-avx512"), (Target.CPU,))
    flags = strategy.flags_for(Target.CPU)
    # For an AVX-512 CPU, IREE's direct channels-last convolutions, not img2col's columns and a matmul.
    assert flags[0] == ("--iree-preprocessing-pass-pipeline=builtin.module(util.func("
                        "iree-preprocessing-convert-conv-to-channels-last))")
    assert flags[1:] == ("--iree-opt-data-tiling=true",)
    # The linear layer (0.6 KFLOP) is below the matmul rule's least work.
    assert {r.family for r in strategy.rules} == {Family.CONV2D}
    assert "convolution on cpu: channels-last convolutions, data-tiled matmuls" in str(strategy)
    rows = {row["family"]: row for row in strategy.describe()}
    assert rows["grouped convolution"]["rule"] == rows["matmul"]["rule"] == "IREE default"
    assert "ResNet-18" in rows["convolution"]["evidence"]


def test_an_avx2_cpu_gets_img2col_for_its_convolutions():
    # IREE's direct channels-last kernel built for AVX2 ran ResNet-18 7x slower than img2col.
    strategy = choose(_mixed_graph(), Options(cpu="haswell"), (Target.CPU,))
    assert strategy.flags_for(Target.CPU)[0] == (
        "--iree-preprocessing-pass-pipeline=builtin.module(util.func("
        "iree-preprocessing-convert-conv-to-channels-last, iree-global-opt-convert-conv2d-to-img2col))")
    assert "convolution on cpu: channels-last, img2col, data-tiled matmul" in str(strategy)


def test_two_rules_naming_one_flag_give_it_once():
    torch.manual_seed(0)
    with torch.no_grad():
        gm = _aten_graph(_ConvTokens().eval(), torch.randn(1, 32, 56, 56))
    strategy = choose(gm, Options(cpu="haswell"), (Target.CPU,))
    assert {r.family for r in strategy.rules} == {Family.CONV2D, Family.MATMUL}
    assert strategy.flags_for(Target.CPU)[1:] == ("--iree-opt-data-tiling=true",)


def test_small_convolutions_keep_iree_defaults():
    # 8 input channels: 0.027 GFLOP of convolution, below the rule's 0.1 (the measured
    # cnn_bn case, where the rule made small convolutions slower).
    strategy = choose(_mixed_graph(inputs=8), Options(), (Target.CPU,))
    assert strategy.rules == () and strategy.flags_for(Target.CPU) == ()


def test_matmul_only_graph_gets_data_tiling_alone():
    with torch.no_grad():
        gm = _aten_graph(nn.Linear(512, 512).eval(), torch.randn(64, 512))  # 0.034 GFLOP
    strategy = choose(gm, Options(cpu="haswell"), (Target.CPU,))
    assert strategy.flags_for(Target.CPU) == ("--iree-opt-data-tiling=true",)
    assert strategy.packed_tile(Target.CPU) == (0, 0)


def test_float32_linear_layers_get_toris_packed_tiles_for_avx512():
    # IREE's 16x16 float32 tiles load once per FMA; tori's 14x32 hold 28 accumulators.
    with torch.no_grad():
        gm = _aten_graph(nn.Linear(512, 512).eval(), torch.randn(128, 512))  # 67 MFLOP
    assert {u.family for u in op_families(gm)} == {Family.FLOAT_MATMUL}
    strategy = choose(gm, Options(cpu="skylake-avx512"), (Target.CPU,))
    assert strategy.flags_for(Target.CPU) == ("--iree-opt-data-tiling=true", "--iree-llvmcpu-enable-ukernels=none")
    assert strategy.packed_tile(Target.CPU) == (14, 32)
    assert "float32 matmul on cpu: tori's packed 14x32 tiles" in str(strategy)
    # The user's microkernels know only IREE's tiles: IREE's data tiling then.
    mine = choose(gm, Options(cpu="skylake-avx512", iree_flags=("--iree-llvmcpu-enable-ukernels=all",)), (Target.CPU,))
    assert mine.packed_tile(Target.CPU) == (0, 0) and mine.flags_for(Target.CPU) == ("--iree-opt-data-tiling=true",)
    # Fewer rows than a packed matmul's least (a decoding step's), less work than its
    # least (the packs would cost more than they save), or other element types: the matmul rule.
    with torch.no_grad():
        few = _aten_graph(nn.Linear(1024, 1024).eval(), torch.randn(PACKED_MIN_ROWS - 1, 1024))
        small = _aten_graph(nn.Linear(512, 512).eval(), torch.randn(64, 512))  # 34 MFLOP
        doubles = _aten_graph(nn.Linear(512, 512).double().eval(), torch.randn(128, 512, dtype=torch.float64))
    for graph in (few, small, doubles):
        assert {u.family for u in op_families(graph)} == {Family.MATMUL}
        assert choose(graph, Options(cpu="skylake-avx512"), (Target.CPU,)).packed_tile(Target.CPU) == (0, 0)


_AVX512_HOST = "+avx512f" in cpu_features("host")


@pytest.mark.skipif(not _AVX512_HOST, reason="tori's packed tiles are for AVX-512 CPUs; this one has none")
@pytest.mark.parametrize("rows, inputs, outputs", [(128, 512, 512), (200, 480, 400), (197, 384, 1152)])
def test_packed_matmuls_match_eager(rows, inputs, outputs):
    # Rows and columns off the tile are padded in the pack and dropped in the unpack; 128
    # rows take tiles of 13 rows, 200 and 197 tiles of 12 (tile_rows). Hidden layers of
    # whole column tiles (512, 1152) stay in their tiles for the second matmul
    # (passes/packed_chains.py): the first matmul is a contraction with the bias and GELU
    # in its dispatch; 400 columns (12.5 tiles) are unpacked and packed again.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(inputs, outputs), nn.GELU(), nn.Linear(outputs, inputs)).eval()
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(rows, inputs), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert graph.codegen.packed_tile(Target.CPU) == (14, 32)
    assert "--iree-llvmcpu-enable-ukernels=none" in graph.stages["iree"]
    vmfb = graph.stages["vmfb"]
    tile = tile_rows(rows, 14)
    assert tile == {128: 13, 200: 12, 197: 12}[rows]
    m1 = -(-rows // tile)
    first, second = f"{m1}x{-(-outputs // 32)}x{tile}x32x{inputs}", f"mmt4d_{m1}x{-(-inputs // 32)}x{outputs}x{tile}x32x1"
    if outputs % 32:
        assert f"mmt4d_{m1}x{-(-outputs // 32)}x{inputs}x{tile}x32x1".encode() in vmfb and b"_matmul_" not in vmfb
        assert b"unpack_elementwise" in vmfb
    else:
        assert f"matmul_like_{first}".encode() in vmfb and f"elementwise_{rows}x{outputs}_f32_pack".encode() not in vmfb
    assert second.encode() in vmfb


@pytest.mark.skipif(not _AVX512_HOST, reason="tori's packed tiles are for AVX-512 CPUs; this one has none")
@pytest.mark.parametrize("activation", ["swiglu", "gelu_tanh", "relu"])
def test_chains_of_packed_matmuls_match_eager(activation):
    # A gated MLP (Llama's: silu(x @ gate) * (x @ up) @ down) has two leaves; GPT-2's
    # tanh GELU ends in a product of two values of the chain. A ReLU alone is no chain
    # (IREE would fold the transposition of the tiles into the contraction, unconfigured).
    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up, self.down = nn.Linear(256, 512, bias=False), nn.Linear(256, 512), nn.Linear(512, 256)

        def forward(self, x):
            if activation == "swiglu":
                hidden = nn.functional.silu(self.gate(x)) * self.up(x)
            elif activation == "gelu_tanh":
                hidden = nn.functional.gelu(self.up(x), approximate="tanh")
            else:
                hidden = torch.relu(self.up(x))
            return self.down(hidden)

    torch.manual_seed(0)
    with torch.no_grad():
        assert_matches_eager(Mlp().eval(), torch.randn(300, 256), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    source, vmfb = graph.iree_bytecode, graph.stages["vmfb"]
    # 300 rows in 25 tiles of 12; the first matmul's dispatch is its configured
    # contraction (loops: row tiles, column tiles, rows, columns, reduction), the
    # hidden layer's ops in it
    if activation == "relu":
        assert b"tiledout" not in source and b"matmul_like" not in vmfb
        assert b"mmt4d_25x16x256x12x32x1" in vmfb
    else:
        assert b"tori_packed_mm_300x256x512_nk_12x32_tiledout" in source
        assert b"tori_packed_mm_300x512x256_nk_12x32_tiledin" in source
        assert b"matmul_like_25x16x12x32x256_" in vmfb and b"elementwise_300x512" not in vmfb


@pytest.mark.skipif(not _AVX512_HOST, reason="tori's packed tiles are for AVX-512 CPUs; this one has none")
def test_a_product_of_two_activations_is_packed_too():
    class Product(nn.Module):
        def forward(self, a, b):
            return torch.relu(a) @ (b * 2)

    torch.manual_seed(0)
    a, b = torch.randn(96, 1600), torch.randn(1600, 256)  # 79 MFLOP, 8 tiles of 12 rows
    with torch.no_grad():
        assert_matches_eager(Product(), a, b * 0.5, options={"cache": False}, rtol=1e-4, atol=1e-4)
        # The product is returned as it is: written in its layout (12 rows divide 96), no unpack.
        assert_matches_eager(Product(), a, b, options={"cache": False}, rtol=1e-4, atol=1e-4)
    vmfb = tori.last_compile().graphs[0].stages["vmfb"]
    assert b"matmul_like_8x8x12x32x1600" in vmfb and b"unpack" not in vmfb


@pytest.mark.skipif(not _AVX512_HOST, reason="tori's packed tiles are for AVX-512 CPUs; this one has none")
@pytest.mark.parametrize("sequences, rows", [(2, 8), (3, 12)])
def test_logits_are_written_in_their_layout_and_match_eager(sequences, rows):
    # A language model's head: the logits leave the graph through a view, written as
    # they lie in tiles that divide them: 256 rows, which none of 14, 13 and 12 divides,
    # in tiles of 8; 384 in tiles of 12; 4000 columns in 125 of 32.
    torch.manual_seed(0)

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.head = nn.LayerNorm(96), nn.Linear(96, 4000, bias=False)

        def forward(self, x):
            return self.head(self.norm(x))

    with torch.no_grad():
        assert_matches_eager(Head().eval(), torch.randn(sequences, 128, 96), options={"cache": False},
                             rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert f"tori_packed_mm_{sequences * 128}x96x4000_nk_{rows}x32_direct".encode() in graph.iree_bytecode
    direct = f"matmul_like_{sequences * 128 // rows}x125x{rows}x32x96".encode()
    assert direct in graph.stages["vmfb"] and b"unpack" not in graph.stages["vmfb"]


def test_the_convolution_tile_needs_half_the_convolution_work():
    # The tile's tuning spec puts IREE's configuration on one thread: a graph whose whole
    # tiles are a small part of its convolutions (RegNetY's stem beside its 24-channel
    # groups) goes without it.
    def tuning(model, x):
        with torch.no_grad():
            graph = _aten_graph(model.eval(), x)
        flags = choose(graph, Options(cpu="skylake-avx512"), (Target.CPU,)).flags_for(Target.CPU)
        spec = [f.split("=", 1)[1] for f in flags if f.startswith("--iree-codegen-tuning-spec-path")]
        return sorted(re.findall(r"@(direct_convolution_\w+)\(", open(spec[0]).read())) if spec else []

    stem = nn.Conv2d(3, 32, 3, 2, 1)
    groups = [nn.Conv2d(32 if i == 0 else 24, 24, 3, 1, 1) for i in range(3)]  # 24 channels: no whole tiles
    assert tuning(stem, torch.randn(8, 3, 224, 224)) == ["direct_convolution_s2_112x32"]
    assert tuning(nn.Sequential(stem, nn.ReLU(), *groups), torch.randn(8, 3, 224, 224)) == []
    # Output columns that are not whole tiles (32, dilation) keep IREE's tile.
    assert tuning(nn.Conv2d(64, 64, 3, 1, 1), torch.randn(8, 64, 32, 32)) == []
    assert tuning(nn.Conv2d(64, 64, 3, 1, 2, dilation=2), torch.randn(8, 64, 56, 56)) == []


@pytest.mark.skipif(not _AVX512_HOST, reason="tori's convolution tiles are for AVX-512 CPUs; this one has none")
def test_direct_convolutions_of_whole_tiles_get_tori_tiles_and_match_eager():
    # IREE's direct channels-last kernel in 14 output columns by 32 channels (a tuning
    # spec, kernel_configs.direct_convolution) for 3x3 convolutions of 64 channels at
    # 56x56 and a strided one onto 32 channels at 28x28; one of 24 channels (a RegNet
    # group's: far slower in that tile) keeps IREE's own.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(24, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(),
                          nn.Conv2d(64, 64, 3, 1, 1), nn.ReLU(),
                          nn.Conv2d(64, 32, 3, 2, 1), nn.ReLU(),
                          nn.Conv2d(32, 24, 3, 1, 1)).eval()
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(4, 24, 56, 56), options={"cache": False}, rtol=1e-4, atol=1e-4)
    from tori.targets.iree_compile import IreeInvocation, run_iree_compile

    graph = tori.last_compile().graphs[0]
    spec = next(f.split("=", 1)[1] for f in graph.iree_invocation.flags if f.startswith("--iree-codegen-tuning-spec-path"))
    matchers = sorted(re.findall(r"@(direct_convolution_\w+)\(", open(spec).read()))
    assert matchers == ["direct_convolution_s1_56x64", "direct_convolution_s2_28x32"]
    configured = IreeInvocation((*graph.iree_invocation.flags, "--compile-to=executable-configurations"))
    text = run_iree_compile(graph.iree_bytecode, configured, graph="configured", timeout_s=300).decode()
    tiles = {}
    for executable in text.split("hal.executable private @")[1:]:
        found = re.search(r"conv_4x(\d+x\d+x\d+)x3x3x\d+_f32", executable)
        if found:
            tiles[found.group(1)] = re.findall(r"vector_common_parallel = (\[[0-9, ]+\])", executable)
    assert tiles["56x56x64"] == ["[1, 1, 14, 32, 0, 0, 0]"], tiles
    assert tiles["28x28x32"] == ["[1, 1, 14, 32, 0, 0, 0]"], tiles
    assert "[1, 1, 14, 32, 0, 0, 0]" not in tiles["28x28x24"], tiles


@pytest.mark.skipif(not _AVX512_HOST, reason="tori's packed tiles are for AVX-512 CPUs; this one has none")
def test_shallow_one_by_one_convolutions_match_eager_unpacked():
    # MobileNetV3's first block at a smaller image: a depthwise convolution of 16
    # channels, then 1x1 convolutions of 16 channels onto 16 and 64 (2048 pixels): IREE's
    # matmuls with tori's tiles, their operands as stored; the 64-deep one is packed.
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.Hardswish(),
        nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16),
        nn.Conv2d(16, 64, 1), nn.ReLU(),
        nn.Conv2d(64, 256, 1), nn.ReLU()).eval()
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(2, 3, 64, 64), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert graph.codegen.packed_tile(Target.CPU) == (14, 32)
    functions = set(re.findall(rb"tori_[a-z]+_mm_[0-9x_nk]+", graph.iree_bytecode))
    assert functions == {b"tori_shallow_mm_2048x16x16", b"tori_shallow_mm_2048x16x64",
                         b"tori_packed_mm_2048x64x256_nk_12x32"}


class _Stem(nn.Module):
    """ResNet's stem: convolution, BatchNorm, ReLU, then a 3x3 stride-2 max pooling whose
    result feeds a convolution and a residual add; 64 channels, so that the graph's
    convolutions (0.1 GFLOP or more) get the channels-last rule."""

    def __init__(self, ceil_mode: bool = False):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1, ceil_mode=ceil_mode))
        self.conv = nn.Conv2d(64, 64, 3, 1, 1)

    def forward(self, x):
        y = self.stem(x)
        return torch.relu(self.conv(y) + y)


def test_max_pooling_runs_channels_last_and_matches_eager():
    # Beside channels-last convolutions the pooling reaches IREE as tori's channels-last
    # function (passes/pooling_nhwc.py), a NaN and -inf included.
    torch.manual_seed(0)
    x = torch.randn(2, 3, 128, 130)
    x[0, 1, 5, 5], x[1, 2, 0, :] = float("nan"), -float("inf")
    with torch.no_grad():
        assert_matches_eager(_Stem().eval(), x, options={"cache": False}, rtol=1e-4, atol=1e-4)
        graph = tori.last_compile().graphs[0]
        assert graph.codegen.channels_last(Target.CPU), str(graph.codegen)
        assert b"tori_max_pool_2x64x65x67_3x3_s2x2_p0x0_d1x1_f32" in graph.iree_bytecode
        assert_matches_eager(_Stem(ceil_mode=True).eval(), torch.randn(2, 3, 128, 131), options={"cache": False},
                             rtol=1e-4, atol=1e-4)
        assert re.search(rb"tori_max_pool_2x64x\d+x\d+_3x3_s2x2", tori.last_compile().graphs[0].iree_bytecode)


def test_max_pooling_beside_default_convolutions_stays_channels_first():
    # Without the convolution rule (the benchmarks' cnn_bn) the transposes around a
    # channels-last pooling would be dispatches of their own.
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 16, 3, padding=1))
    with torch.no_grad():
        assert_matches_eager(model.eval(), torch.randn(2, 3, 32, 32), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert not graph.codegen.channels_last(Target.CPU)
    assert b"tori_max_pool" not in graph.iree_bytecode


def test_small_images_stay_convolutions_below_the_convolution_rule():
    # The benchmarks' cnn_bn (0.045 GFLOP of convolutions): without the rule its
    # convolutions run on IREE's default kernels, and its small images' columns as
    # matmuls were slower than those (frontend/decomp/grouped_conv.py).
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1))
    with torch.no_grad():
        assert_matches_eager(model.eval(), torch.randn(8, 3, 32, 32), options={"cache": False}, rtol=1e-4, atol=1e-4)
    uses = {u.family: u.ops for u in tori.last_compile().graphs[0].codegen.uses}
    assert uses == {Family.CONV2D: 3}, uses


def test_max_pooling_trains_channels_last():
    # tori's decomposition takes the indices from comparisons with the pooled values
    # (frontend/decomp/pytorch.py), so the forward's pooling is channels last too.
    torch.manual_seed(0)
    model = _Stem()
    x = torch.randn(2, 3, 128, 130)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "cache": False})
    with count_graphs() as count:
        compiled(x).square().mean().backward()
    assert count.compiled_graphs == 2  # forward and backward
    grads = [p.grad for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    for grad, p in zip(grads, model.parameters()):
        torch.testing.assert_close(grad, p.grad, rtol=1e-3, atol=1e-5)
    forward = next(g for g in tori.last_compile().graphs if g.kind == "forward")
    assert b"tori_max_pool_2x64x65x67_3x3_s2x2_p0x0_d1x1_f32" in forward.iree_bytecode


def test_small_matmuls_keep_iree_defaults():
    # 0.002 MFLOP: data tiling made iree-compile 30% slower and the call no faster.
    with torch.no_grad():
        gm = _aten_graph(nn.Linear(16, 16).eval(), torch.randn(4, 16))
    assert choose(gm, Options(), (Target.CPU,)).flags_for(Target.CPU) == ()


def test_elementwise_graph_keeps_iree_defaults():
    gm = _aten_graph(nn.ReLU(), torch.randn(4, 16))
    strategy = choose(gm, Options(), (Target.CPU,))
    assert strategy.flags_for(Target.CPU) == () and str(strategy) == "IREE defaults"


def test_user_flags_win_and_codegen_none_applies_no_rule():
    gm = _mixed_graph()
    mine = choose(gm, Options(iree_flags=("--iree-opt-data-tiling=false",)), (Target.CPU,))
    assert all(not f.startswith("--iree-opt-data-tiling") for f in mine.flags_for(Target.CPU))
    assert mine.flags_for(Target.CPU)[0].startswith("--iree-preprocessing-pass-pipeline=")
    assert choose(gm, Options(codegen=Codegen.NONE), (Target.CPU,)).flags_for(Target.CPU) == ()
    # Rules are measured on the CPU only: a GPU target keeps IREE's defaults.
    assert choose(gm, Options(), (Target.CPU, Target.VULKAN)).flags_for(Target.VULKAN) == ()


def test_strategy_is_part_of_the_cache_key():
    gm = _mixed_graph()
    auto = choose(gm, Options(), (Target.CPU,))
    none = choose(gm, Options(codegen=Codegen.NONE), (Target.CPU,))
    assert compile_key("module {}", Options(), auto) != compile_key("module {}", Options(), none)


def test_codegen_option_is_validated():
    assert Options.from_mapping({"codegen": "none"}).codegen is Codegen.NONE
    with pytest.raises(OptionsError, match="codegen"):
        Options.from_mapping({"codegen": "fast"})


@pytest.mark.parametrize("codegen", ["auto", "none"])
def test_each_strategy_matches_eager_and_reaches_iree_compile(codegen):
    torch.manual_seed(0)
    model = _Mixed().eval()
    x = torch.randn(1, 32, 56, 56)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"codegen": codegen, "cache": False}, rtol=1e-4, atol=1e-5)
    graph = tori.last_compile().graphs[0]
    command = graph.stages["iree"]
    assert ("iree-preprocessing-convert-conv-to-channels-last" in command) is (codegen == "auto")
    assert ("--iree-opt-data-tiling=true" in command) is (codegen == "auto")
    assert (str(graph.codegen) == "IREE defaults") is (codegen == "none")


class _MaskedIntMatmul(nn.Module):
    def forward(self, a, b, mask):
        return torch.where(mask, torch._int_mm(a, b), 0)


def test_a_rule_that_makes_iree_fail_takes_the_other_data_tiling_path(caplog):
    # IREE 3.13's data tiling (the dispatch-creation path) fuses a `where` into the
    # matmul's epilogue and encodes its boolean input, whose encoding executable fails
    # ("'iree_codegen.load_from_buffer' op buffer and tensor shapes must be compatible");
    # tori-materialize-masks keeps float selections and boolean constants out of that
    # path, not an integer one: the graph compiles again with the global-optimization
    # path, with one warning, and runs compiled.
    a = torch.randint(-128, 128, (64, 1024), dtype=torch.int8, generator=torch.Generator().manual_seed(0))
    b = torch.randint(-128, 128, (1024, 512), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    mask = torch.rand(64, 512, generator=torch.Generator().manual_seed(2)) > 0.5
    with torch.no_grad(), caplog.at_level("WARNING", logger="tori.compile"):
        assert_matches_eager(_MaskedIntMatmul(), a, b, mask, options={"cache": False}, rtol=0, atol=0)
    graph = tori.last_compile().graphs[0]
    assert graph.codegen.rules != () and "load_from_buffer" in graph.codegen.dropped
    assert "--iree-opt-data-tiling" not in graph.stages["iree"] and "--iree-global-opt-data-tiling" in graph.stages["iree"]
    assert "global-optimization data tiling" in str(graph.codegen)
    assert [r.getMessage() for r in caplog.records if "iree-compile failed" in r.getMessage()] == [
        next(r.getMessage() for r in caplog.records if "compiling with IREE's global-optimization data tiling" in
             r.getMessage())]


def test_a_causal_mask_folded_to_a_constant_keeps_the_first_data_tiling_path():
    # The benchmarks' hand-written attention block masks its scores with
    # `triu(ones(...))`, which tori-fold-constants makes an i1 constant: IREE's data
    # tiling failed on its encoding (above) until tori-materialize-masks stored it as
    # bytes, and the graph was compiled twice.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from models import MODELS

    spec = MODELS["hand_attention"]
    with torch.no_grad():
        assert_matches_eager(spec.build(), *spec.example_inputs(), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert graph.codegen.rules != () and graph.codegen.dropped == "", str(graph.codegen)
    assert "--iree-opt-data-tiling=true" in graph.stages["iree"]


def test_int8_matmuls_are_matmuls():
    # torch._int_mm, the int8 x int8 -> int32 product of dynamically quantized linear
    # layers: without the matmul rule's data tiling, a 64x1024x1024 one took 2.09 ms
    # per call, with it 0.35 ms (tori profile, the wide MLP of benchmarks/bench_quantized.py).
    class IntMatmul(nn.Module):
        def forward(self, a, b):
            return torch._int_mm(a, b)

    a = torch.randint(-128, 128, (64, 1024), dtype=torch.int8)
    b = torch.randint(-128, 128, (1024, 512), dtype=torch.int8)
    uses = {u.family: u for u in op_families(_aten_graph(IntMatmul(), a, b))}
    assert uses[Family.MATMUL].ops == 1
    assert uses[Family.MATMUL].gflop == pytest.approx(2 * 64 * 1024 * 512 / 1e9)
    assert choose(_aten_graph(IntMatmul(), a, b), Options(), (Target.CPU,)).flags_for(Target.CPU) == (
        "--iree-opt-data-tiling=true",)


class _DecodingAttention(nn.Module):
    """One decoding step's attention: two query rows per key/value head (shared heads)
    against a cache of 512 positions, scaled, softmaxed, times the values."""

    def forward(self, q, k, v):
        return torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)) * 0.125, -1), v)


def _decoding_inputs(rows: int = 2):
    torch.manual_seed(0)
    return torch.randn(4, rows, 64), torch.randn(4, 512, 64), torch.randn(4, 512, 64)


def test_narrow_batched_matmuls_get_toris_tiles():
    uses = {u.family: u for u in op_families(_aten_graph(_DecodingAttention(), *_decoding_inputs()))}
    assert set(uses) == {Family.NARROW_BATCH_MATMUL} and uses[Family.NARROW_BATCH_MATMUL].ops == 2
    flags = choose(_aten_graph(_DecodingAttention(), *_decoding_inputs()), Options(), (Target.CPU,)).flags_for(
        Target.CPU)
    assert len(flags) == 1 and flags[0].startswith("--iree-preprocessing-transform-spec-filename=")
    spec = flags[0].split("=", 1)[1]
    text = open(spec).read()
    assert text.count("#iree_codegen.compilation_info<") == 6 and "@rows2_transposed -> @dot2" in text
    # The dot products: 8 keys of 2 rows a vector tile, 64 of the head a step.
    assert "vector_common_parallel = [1, 2, 8, 0], vector_reduction = [0, 0, 0, 64]" in text
    # Sixteen rows per batch is a prefill's attention: IREE's data-tiled matmul.
    wide = {u.family for u in op_families(_aten_graph(_DecodingAttention(), *_decoding_inputs(16)))}
    assert wide == {Family.MATMUL}


@pytest.mark.parametrize("codegen", ["auto", "none"])
def test_data_tiling_does_not_repack_a_cache_for_narrow_matmuls(codegen):
    # With data tiling, IREE packs a batched matmul's operands into its tiled layout;
    # the cache, an input, was packed on every call (an `_encoding_..._encode_4x512x64`
    # executable). tori's tiles keep data tiling off the narrow matmuls.
    q, k, v = _decoding_inputs()
    options = {"codegen": codegen, "cache": False, "iree_flags": ("--iree-opt-data-tiling=true",)}
    assert_matches_eager(_DecodingAttention(), q, k, v, options=options, rtol=1e-4, atol=1e-5)
    vmfb = tori.last_compile().graphs[0].stages["vmfb"]
    assert b"batch_matmul_4x2x512x64" in vmfb and b"batch_matmul_4x2x64x512" in vmfb
    assert (b"encode_4x512x64" in vmfb) is (codegen == "none")


@pytest.mark.parametrize("rows, head, keys", [(1, 32, 100), (2, 64, 512), (4, 128, 77), (2, 80, 64)])
def test_narrow_dot_products_of_any_head_match_eager(rows, head, keys):
    # tori's dot tile takes 64 of a head at a time: shorter heads, longer ones, a head
    # of 80 (64 and a partial 16) and key counts that are no whole tile.
    torch.manual_seed(0)
    q, k, v = torch.randn(3, rows, head), torch.randn(3, keys, head), torch.randn(3, keys, head)
    assert_matches_eager(_DecodingAttention(), q, k, v, options={"cache": False}, rtol=1e-4, atol=1e-5)
    assert f"batch_matmul_3x{rows}x{keys}x{head}".encode() in tori.last_compile().graphs[0].stages["vmfb"]


@pytest.mark.parametrize("rows, family", [(64, Family.WIDE_MATMUL), (1024, Family.WIDE_MATMUL), (16, Family.MATMUL)])
def test_rows_onto_a_vocabulary_sized_weight_get_larger_workgroup_tiles(rows, family):
    # 256 x 33000 float32: 33.8 MB, a language model's output projection. From
    # WIDE_MIN_ROWS rows IREE's default tiles read each column tile from memory several times.
    projection = nn.Linear(256, 33000, bias=False).eval()
    with torch.no_grad():
        gm = _aten_graph(projection, torch.randn(rows, 256))
    assert {u.family for u in op_families(gm)} == {family}
    flags = choose(gm, Options(), (Target.CPU,)).flags_for(Target.CPU)
    wide = ("--iree-opt-data-tiling=true", "--iree-llvmcpu-matmul-tile-bytes=2097152")
    assert flags == (wide if family is Family.WIDE_MATMUL else wide[:1])


def test_wide_matmul_rule_matches_eager():
    torch.manual_seed(0)
    projection = nn.Linear(256, 33000, bias=False).eval()
    with torch.no_grad():
        assert_matches_eager(projection, torch.randn(64, 256), options={"cache": False}, rtol=1e-4, atol=1e-4)
    graph = tori.last_compile().graphs[0]
    assert "larger workgroup tiles" in str(graph.codegen)
    assert "--iree-llvmcpu-matmul-tile-bytes=2097152" in graph.stages["iree"]


def test_layer_norm_moments_in_one_pass_match_eager():
    # A transformer block's normalizations: LayerNorm's mean and variance in one pass
    # over the rows, RMSNorm's mean of squares squared in its lane sums (passes/row_reductions.py).
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(128)
            self.fc = nn.Linear(128, 64)
            self.rms_weight = nn.Parameter(torch.rand(64) + 0.5)

        def forward(self, x):
            y = self.fc(self.norm(x))
            return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms_weight

    block = Block().eval()
    with torch.no_grad():
        assert_matches_eager(block, torch.randn(2, 40, 128), options={"cache": False}, rtol=1e-4, atol=1e-4)
    code = tori.last_compile().graphs[0].iree_bytecode
    assert b"tori_row_moments_2x40x128_f32" in code and b"tori_row_mean_square_2x40x64_f32" in code


def test_row_maxima_and_sums_match_eager():
    # Rows of 128: 8 vectors of 16 lanes (the maximum), 16 of 8 (the sum); a row's
    # maximum in its last lane, -inf and NaN included.
    def rows(x):
        return torch.softmax(x, -1), x.amax(-1, keepdim=True), x.sum(-1, keepdim=True)

    x = torch.randn(3, 7, 128)
    x[1, 2, 127] = 50.0
    x[0, 0, 5] = -float("inf")
    x[2, 3, 40] = float("nan")
    with torch.no_grad():
        assert_matches_eager(rows, x, options={"cache": False}, rtol=1e-5, atol=1e-5)
    code = tori.last_compile().graphs[0].iree_bytecode
    assert b"tori_row_max_3x7x128_f32" in code and b"tori_row_sum_3x7x128_f32" in code


def test_an_rms_normalization_over_rows_not_a_power_of_two_matches_eager():
    # T5's and Llama's normalization: the mean of the squares, squared in float64 lanes,
    # the lanes reduced apart and scaled by 1/200 (not exact in binary) before the
    # float32 result.
    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    x, weight = torch.randn(2, 48, 200) * 3.0, torch.randn(200)
    with torch.no_grad():
        assert_matches_eager(rms, x, weight, options={"cache": False}, rtol=1e-6, atol=1e-6)
    assert b"tori_row_mean_square_2x48x200_f32" in tori.last_compile().graphs[0].iree_bytecode


def test_layer_norm_moments_keep_the_precision_of_rows_far_from_zero():
    # Rows of mean 3e3 and standard deviation 1: a float32 E[x^2] - E[x]^2 would lose
    # every digit of the variance; in float64 tori's result is as close to the float64
    # reference as eager's Welford sums are (closer, here).
    torch.manual_seed(0)
    norm = nn.LayerNorm(128)
    x = torch.randn(4, 30, 128) + 3000.0
    compiled = torch.compile(norm, backend="tori", options={"fallback": "error", "cache": False})
    with torch.no_grad():
        reference = copy.deepcopy(norm).double()(x.double())
        eager_error = (norm(x).double() - reference).abs().max().item()
        tori_error = (compiled(x).double() - reference).abs().max().item()
    assert b"tori_row_moments_4x30x128_f32" in tori.last_compile().graphs[0].iree_bytecode
    assert tori_error <= 1.5 * eager_error, (tori_error, eager_error)


def test_layer_norm_moments_train():
    norm = nn.LayerNorm(64)
    x = torch.randn(3, 5, 64, requires_grad=True)
    compiled = torch.compile(norm, backend="tori", options={"fallback": "error", "cache": False})
    with count_graphs() as count:
        compiled(x).square().sum().backward()
    assert count.compiled_graphs == 2  # forward and backward
    grads, x.grad = (x.grad, norm.weight.grad), None
    norm.weight.grad = None
    norm(x).square().sum().backward()
    torch.testing.assert_close(grads[0], x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads[1], norm.weight.grad, rtol=1e-4, atol=1e-4)
    forward = next(g for g in tori.last_compile().graphs if g.kind == "forward")
    assert b"tori_row_moments_3x5x64_f32" in forward.iree_bytecode
