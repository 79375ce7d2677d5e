"""Grouped convolutions as taps of the padded input (tori/frontend/decomp/grouped_conv.py)
and float32 depthwise ones in channels-last form (tori/passes/depthwise_nhwc.py),
compiled and compared with eager: strides, padding, dilation, channel multipliers,
batches, float16, and gradients."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import tori
from tori.testing import assert_matches_eager

CASES = {
    # name: (in channels, out channels, kernel, stride, padding, dilation, groups, bias, batch, size)
    "depthwise 3x3": (16, 16, 3, 1, 1, 1, 16, True, 2, 9),
    "depthwise 7x7 ConvNeXt": (8, 8, 7, 1, 3, 1, 8, True, 1, 14),
    "depthwise stride 2": (12, 12, 3, 2, 1, 1, 12, False, 3, 11),
    "depthwise dilated": (6, 6, 3, 1, 2, 2, 6, True, 1, 10),
    "channel multiplier": (4, 12, 3, 1, 0, 1, 4, True, 2, 8),
    "grouped RegNet": (24, 24, 3, 1, 1, 1, 3, False, 1, 12),
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
    depthwise = cin == cout == groups
    # Depthwise: one convolution, IREE's input calls its channels-last function; others decomposed.
    assert ("aten.convolution" in graph.stages["aten"]) == depthwise
    assert ("call @tori_depthwise_" in graph.iree_input) == depthwise


def test_grouped_convolution_float16_and_gradients():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=4).half().eval()
    x = torch.randn(1, 8, 6, 6).half()
    with torch.no_grad():
        assert_matches_eager(conv, x, rtol=2e-3, atol=2e-3)
    depthwise = torch.nn.Conv2d(6, 6, 3, padding=1, groups=6)
    x = torch.randn(2, 6, 5, 5, requires_grad=True)

    def step(model, x):
        out = model(x)
        out.square().sum().backward()
        return out

    reference = step(depthwise, x)
    expected = (x.grad.clone(), depthwise.weight.grad.clone())
    x.grad = depthwise.weight.grad = depthwise.bias.grad = None
    actual = step(torch.compile(depthwise, backend="tori", options={"fallback": "error"}), x)
    torch.testing.assert_close(actual, reference, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close((x.grad, depthwise.weight.grad), expected, rtol=1e-4, atol=1e-4)


def test_ordinary_convolution_is_left_to_iree():
    conv = torch.nn.Conv2d(3, 4, 3).eval()
    with torch.no_grad():
        assert_matches_eager(conv, torch.randn(1, 3, 8, 8), rtol=1e-4, atol=1e-5)
    assert "aten.convolution" in tori.last_compile().graphs[0].stages["aten"]


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
