"""Convolutions rewritten before import (tori/frontend/decomp/grouped_conv.py): 1x1 ones
as matmuls, grouped ones as one convolution per group or as taps of the padded input,
and float32 depthwise ones in channels-last form, one input channel's as a sum of
taps (tori/passes/depthwise_nhwc.py),
compiled and compared with eager: strides, padding, dilation, channel multipliers,
batches, float16, and gradients."""

import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tori
from tori.config import Options
from tori.frontend.decomp.grouped_conv import SPLIT_MIN_GFLOP
from tori.targets.codegen import direct_convolutions
from tori.targets.dispatches import dispatches_of, recorded_flow_ir
from tori.testing import assert_matches_eager

CASES = {
    # name: (in channels, out channels, kernel, stride, padding, dilation, groups, bias, batch, size)
    "depthwise 3x3": (16, 16, 3, 1, 1, 1, 16, True, 2, 9),
    "depthwise 7x7 ConvNeXt": (8, 8, 7, 1, 3, 1, 8, True, 1, 14),
    "depthwise stride 2": (12, 12, 3, 2, 1, 1, 12, False, 3, 11),
    "depthwise dilated": (6, 6, 3, 1, 2, 2, 6, True, 1, 10),
    "channel multiplier": (4, 12, 3, 1, 0, 1, 4, True, 2, 8),
    "one input channel": (1, 16, 3, 1, 1, 1, 1, True, 2, 9),
    "one input channel, strided, dilated, asymmetric": (1, 6, (5, 3), (2, 1), (2, 0), (1, 2), 1, False, 3, 11),
    "grouped RegNet": (24, 24, 3, 1, 1, 1, 3, False, 1, 12),
    "grouped RegNet, its first stage at 224x224": (48, 48, 3, 1, 1, 1, 2, False, 1, 56),
    "grouped stride 2 asymmetric": (8, 16, (3, 1), (2, 1), (1, 0), 1, 2, True, 2, 9),
}


@pytest.mark.parametrize("case", list(CASES))
def test_grouped_convolution_matches_eager(case, tmp_path):
    cin, cout, kernel, stride, padding, dilation, groups, bias, batch, size = CASES[case]
    conv = torch.nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups, bias).eval()
    x = torch.randn(batch, cin, size, size + 1)
    with torch.no_grad():
        assert_matches_eager(conv, x, options={"dump_dir": str(tmp_path)}, rtol=1e-4, atol=1e-5)
    graph = tori.last_compile().graphs[0]
    depthwise = cin == groups and (cin == cout or cin == 1)  # one input channel: its multiplier form
    out_h, out_w = (F.conv2d(x, conv.weight, None, stride, padding, dilation, groups).shape[-2:])
    gflop = 2 * batch * out_h * out_w * cout * (cin // groups) * conv.weight.shape[2] * conv.weight.shape[3] / 1e9
    split = cin // groups > 1 and gflop >= SPLIT_MIN_GFLOP and direct_convolutions(Options())
    # Depthwise: one convolution, IREE's input calls its channels-last function. Several
    # channels per group and enough work, for a CPU with IREE's direct kernels (AVX-512):
    # one convolution of one group per group. Otherwise, taps.
    groups_of_each = re.findall(r"aten\.convolution\.default\([^)]*\], (\d+)\)", graph.stages["aten"])
    assert groups_of_each == ([str(groups)] if depthwise else ["1"] * groups if split else [])
    assert ("call @tori_depthwise_" in graph.iree_input) == depthwise


@pytest.mark.parametrize("stride, bias, batch", [(1, True, 2), (2, False, 3), ((2, 1), True, 1)])
def test_pointwise_convolution_is_a_matmul_of_its_pixels(stride, bias, batch):
    conv = torch.nn.Conv2d(12, 20, 1, stride=stride, bias=bias).eval()
    x = torch.randn(batch, 12, 9, 7)
    with torch.no_grad():
        assert_matches_eager(conv, x, rtol=1e-4, atol=1e-5)
    aten_code = tori.last_compile().graphs[0].stages["aten"]
    assert "aten.convolution" not in aten_code and "aten.mm.default(" in aten_code


def test_image_patches_are_a_matmul_and_padded_windows_stay_convolutions():
    # A vision transformer's patches (the stride is the kernel), an image that the patches
    # do not tile (its last rows and columns are in no window), a padded 1x1 convolution,
    # and a grouped 1x1 one with 0.05 GFLOP of work (a matmul per group where the CPU
    # has IREE's direct kernels, else the taps' batched matmul).
    split = direct_convolutions(Options())
    cases = [(torch.nn.Conv2d(3, 16, 4, stride=4), (2, 3, 16, 16), 1, 0),
             (torch.nn.Conv2d(5, 7, (2, 3), stride=(2, 3), bias=False), (1, 5, 9, 10), 1, 0),
             (torch.nn.Conv2d(4, 6, 1, padding=1), (1, 4, 46, 46), 0, 1),
             (torch.nn.Conv2d(128, 128, 1, groups=2), (1, 128, 56, 56), 2 if split else 0, 0)]
    for conv, shape, matmuls, convolutions in cases:
        with torch.no_grad():
            assert_matches_eager(conv.eval(), torch.randn(*shape), rtol=1e-4, atol=1e-5)
        aten_code = tori.last_compile().graphs[0].stages["aten"]
        assert (aten_code.count("aten.mm.default("), aten_code.count("aten.convolution.default(")) == (
            matmuls, convolutions)


@pytest.mark.parametrize("options", [
    {"cpu": "haswell"},  # img2col there: one convolution per group was slower than the taps
    {"iree_flags": ["--iree-preprocessing-pass-pipeline=builtin.module(util.func("
                    "iree-preprocessing-convert-conv-to-channels-last, iree-global-opt-convert-conv2d-to-img2col))"]},
], ids=["avx2-cpu", "users-preprocessing"])
def test_grouped_convolution_keeps_its_taps_where_iree_does_not_run_direct_kernels(options):
    # 0.065 GFLOP: split where the rule's direct kernels run.
    conv = torch.nn.Conv2d(48, 48, 3, padding=1, groups=2).eval()
    with torch.no_grad():
        assert_matches_eager(conv, torch.randn(1, 48, 56, 56), options=options, rtol=1e-4, atol=1e-4)
    aten_code = tori.last_compile().graphs[0].stages["aten"]
    assert "aten.convolution" not in aten_code and "aten.bmm.default(" in aten_code


def _assert_trains_as_eager(model: torch.nn.Module, x: torch.Tensor):
    """One step's output and gradients (input and parameters), compiled against eager."""
    x.requires_grad_(True)

    def step(module):
        x.grad = None
        for p in model.parameters():
            p.grad = None
        out = module(x)
        out.square().sum().backward()
        return out, (x.grad, *(p.grad for p in model.parameters()))

    reference, expected = step(model)
    actual, grads = step(torch.compile(model, backend="tori", options={"fallback": "error"}))
    torch.testing.assert_close(actual, reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads, expected, rtol=1e-4, atol=1e-4)


def test_pointwise_and_split_grouped_convolutions_train():
    torch.manual_seed(0)
    # The grouped convolution: 2 * 2 images * 48x48 * 64 * 32 * 9 = 0.17 GFLOP, split
    # where the CPU has IREE's direct kernels.
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 64, 1, stride=2), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 64, 3, padding=1, groups=2))
    _assert_trains_as_eager(model, torch.randn(2, 8, 96, 96))
    forward = tori.last_compile().forward.stages["aten"]
    assert "aten.mm.default(" in forward
    groups_of_each = re.findall(r"aten\.convolution\.default\([^)]*\], (\d+)\)", forward)
    assert groups_of_each == (["1", "1"] if direct_convolutions(Options()) else [])


def test_small_grouped_convolutions_keep_their_taps_where_splitting_them_would_not_pay():
    # RegNetY's last stage at 224x224 and one image: 888 channels in 37 groups at 7x7,
    # 0.019 GFLOP; one executable per group would cost more compile time than it saves.
    conv = torch.nn.Conv2d(888, 888, 3, padding=1, groups=37, bias=False).eval()
    with torch.no_grad():
        assert_matches_eager(conv, torch.randn(1, 888, 7, 7), rtol=1e-4, atol=1e-4)
    aten_code = tori.last_compile().graphs[0].stages["aten"]
    assert "aten.convolution" not in aten_code and "aten.bmm.default(" in aten_code


def test_grouped_convolution_float16_and_gradients():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4).half().eval()
    x = torch.randn(1, 8, 6, 6).half()
    with torch.no_grad():
        assert_matches_eager(conv, x, rtol=2e-3, atol=2e-3)
    _assert_trains_as_eager(torch.nn.Conv2d(6, 6, 3, padding=1, groups=6), torch.randn(2, 6, 5, 5))


def test_ordinary_convolution_is_left_to_iree():
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    with torch.no_grad():  # 46x46 output pixels: more than SMALL_IMAGE_ROWS
        assert_matches_eager(conv, torch.randn(1, 3, 48, 48), rtol=1e-4, atol=1e-5)
    assert "aten.convolution" in tori.last_compile().graphs[0].stages["aten"]


@pytest.mark.parametrize("stride, padding, dilation, batch, bias", [
    (1, 1, 1, 1, False),  # ResNet's 3x3 at 7x7
    (2, 1, 1, 2, True),   # its first strided 3x3 of a stage
    ((2, 1), (0, 2), (1, 2), 3, True),
])
def test_convolution_over_few_pixels_is_a_matmul_of_its_columns_where_direct_kernels_run(
        stride, padding, dilation, batch, bias):
    # 0.1 GFLOP or more: the convolution rule applies to the graph (below it the
    # convolution keeps IREE's default kernel, `_convolution_rule_applies`).
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(256, 512, 3, stride=stride, padding=padding, dilation=dilation, bias=bias).eval()
    x = torch.randn(batch, 256, 9, 9)
    with torch.no_grad():
        assert_matches_eager(conv, x, rtol=1e-4, atol=1e-4)
    aten_code = tori.last_compile().graphs[0].stages["aten"]
    direct = direct_convolutions(Options())
    assert (aten_code.count("aten.mm.default("), aten_code.count("aten.convolution.default(")) == (
        (1, 0) if direct else (0, 1))
    if direct:
        # The columns: the padded input's windows, channels last, in one indexing op that
        # IREE makes one gather dispatch (the kh*kw views stacked were a copy dispatch each).
        assert "aten.index.Tensor(" in aten_code and "aten.cat.default(" not in aten_code
        dispatches = dispatches_of(recorded_flow_ir(tori.last_compile().graphs[0]))
        assert dispatches.by_kind()["slow"] <= 1, dispatches.entries  # the padded input's copy


@pytest.mark.parametrize("length, stride, padding, dilation, batched", [
    (4, 2, 0, 1, False),  # found by the fuzzer: the last element is in no window
    (6, 2, 1, 1, True),
    (11, 3, 0, 2, True),
    (7, 1, 0, 1, True),  # windows tile the input: left as it is
])
def test_ragged_1d_convolution_is_cut_to_what_its_windows_read(length, stride, padding, dilation, batched):
    weight = torch.linspace(-1, 1, 24).reshape(2, 4, 3)
    x = torch.randn(2, 4, length) if batched else torch.randn(4, length)
    assert_matches_eager(lambda x: F.conv1d(x, weight, stride=stride, padding=padding, dilation=dilation), x,
                         rtol=1e-5, atol=1e-5)
    aten_code = tori.last_compile().forward.stages["aten"]
    assert ("aten.slice" in aten_code) == ((length + 2 * padding - dilation * 2 - 1) % stride != 0)


def test_grouped_convolution_compiles_where_no_quantized_op_is_registered():
    """The decomposition asks whether a grouped convolution's operands are quantized
    (frontend/quantized.py) in a process where the quantized_decomposed ops were never
    registered: a fresh interpreter that imports no quantization."""
    script = (
        "import torch, tori\n"
        "conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2).eval()\n"
        "x = torch.randn(1, 8, 6, 6)\n"
        "assert not hasattr(torch.ops.quantized_decomposed, 'dequantize_per_tensor')\n"
        "with torch.no_grad():\n"
        "    out = torch.compile(conv, backend='tori', options={'fallback': 'error', 'cache': False})(x)\n"
        "torch.testing.assert_close(out, conv(x), rtol=1e-4, atol=1e-5)\n"
        "print('compiled')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "compiled" in done.stdout, done.stderr[-3000:]


def test_split_groups_read_slabs_and_their_weights_are_globals_of_their_own():
    # 4 groups of 24 channels at 28x29, 0.17 GFLOP: split where direct kernels run. Each
    # group reads a contiguous slab of the input laid out (G, N, H, W, c): one transpose
    # around all groups, no copy of each group's channels in and out (8 copy dispatches
    # when its channels were sliced from the NCHW input). Each group's weight is a copy
    # made by the weight prologue when the weights load, so that IREE's initializer lays
    # the groups' filters out with one executable rather than one per offset into the
    # whole weight.
    from iree.compiler import ir

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(96, 96, 3, 1, 1, 1, 4, True).eval()
    x = torch.randn(2, 96, 28, 29)
    with torch.no_grad():
        assert_matches_eager(conv, x, rtol=1e-4, atol=1e-5)
    graph = tori.last_compile().graphs[0]
    context = ir.Context()
    context.allow_unregistered_dialects = True
    text = ir.Module.parse(graph.iree_bytecode, context).operation.get_asm()
    derived = re.findall(r"util\.global private @derived\d+ .*?: (tensor<[^>]*>)", text)
    if not direct_convolutions(Options()):
        assert derived == []  # taps (tested above)
        return
    assert derived == ["tensor<24x24x3x3xf32>"] * 4
    dispatches = dispatches_of(recorded_flow_ir(graph))
    kinds = dispatches.by_kind()
    assert kinds["conv"] == 4 and kinds["slow"] == 0, dispatches.entries
