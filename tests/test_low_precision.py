"""Low precision through tori. int8 models from PyTorch 2 export quantization
(torchao's PT2E flow with X86InductorQuantizer): the rewrites of
tori/frontend/quantized.py, integer contractions in the dispatches IREE forms, int8
weights kept in the module, results against eager's quantized model, and exported
artifacts run without PyTorch. bf16 autocast and models cast to 16-bit floats
against eager."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tori
from tori.frontend.quantized import int8_depthwise_conv2d, int8_grouped_conv2d, quantized_conv2d, rewrite_quantized
from tori.frontend.signature import ArgKind
from tori.targets.cpu import cpu_features, float16_types_without_arithmetic
from tori.targets.dispatches import dispatches_of, recorded_flow_ir
from tori.testing import assert_matches_eager, count_graphs, quantize_pt2e

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_quantized import WideMLP  # noqa: E402

import torch.ao.quantization.fx._decomposed  # noqa: E402,F401  (registers the quantized_decomposed ops)

qd = torch.ops.quantized_decomposed


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64), torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class Tokens(torch.nn.Module):
    """Linear layers of 3-D inputs: one non-contiguous (a transpose; it becomes a bmm
    against the weight expanded over the batch), one contiguous (rows of an mm)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(64, 128), torch.nn.Linear(128, 32)

    def forward(self, x):
        return self.b(torch.relu(self.a(x.transpose(1, 2))))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.c3 = torch.nn.Conv2d(32, 32, 1, bias=False)
        self.c4 = torch.nn.Conv2d(32, 32, 3, padding=2, dilation=2)
        self.fc = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.relu(self.c4(torch.relu(self.c3(x))))
        return self.fc(x.mean((2, 3)))


class Grouped(torch.nn.Module):
    """Grouped convolutions of mobile networks: RegNet's (several channels per group),
    MobileNet's depthwise ones (one; strided), and a depthwise one with a channel
    multiplier."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 32, 1)
        self.grouped = torch.nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.depthwise = torch.nn.Conv2d(32, 32, 5, stride=2, padding=2, groups=32)
        self.multiplier = torch.nn.Conv2d(32, 64, 3, padding=1, groups=32, bias=False)
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x):
        x = torch.relu(self.grouped(torch.relu(self.a(x))))
        x = torch.relu(self.multiplier(torch.relu(self.depthwise(x))))
        return self.fc(x.mean((2, 3)))


class InvertedResidual(torch.nn.Module):
    """MobileNet's and EfficientNet's block: a 1x1 expansion, a depthwise convolution,
    squeeze-excitation, a 1x1 projection and a residual add."""

    def __init__(self, channels=16, expanded=64):
        super().__init__()
        self.expand = torch.nn.Conv2d(channels, expanded, 1)
        self.depthwise = torch.nn.Conv2d(expanded, expanded, 3, padding=1, groups=expanded)
        self.squeeze, self.excite = torch.nn.Conv2d(expanded, 8, 1), torch.nn.Conv2d(8, expanded, 1)
        self.project = torch.nn.Conv2d(expanded, channels, 1)

    def forward(self, x):
        y = F.silu(self.depthwise(F.silu(self.expand(x))))
        y = y * torch.sigmoid(self.excite(torch.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        return x + self.project(y)


class MobileNetLike(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = torch.nn.Sequential(InvertedResidual(), InvertedResidual())

    def forward(self, x):
        return self.blocks(torch.relu(self.stem(x))).mean((2, 3))


def _integer_matmuls(graph) -> tuple[list[str], list[str]]:
    """The graph's contraction dispatches (IREE's flow phase): integer ones, others."""
    entries = dispatches_of(recorded_flow_ir(graph)).entries
    # int8 x int8 (sign-extended): uint8 activations would make `extui` operands, which
    # IREE neither data-tiles nor gives its integer kernels
    executables = recorded_flow_ir(graph).split("flow.executable private @")[1:]
    exports = [(re.search(r"flow\.executable\.export public @(\S+)", e), e) for e in executables]
    contractions = [(m.group(1), e) for m, e in exports if m and "matmul" in m.group(1)]
    assert contractions and not [name for name, e in contractions if "arith.extui" in e]
    contractions = [e for e in entries if "matmul" in e or "conv" in e]
    integer = [e for e in contractions if e.endswith("_i8xi8xi32")]
    return integer, [e for e in contractions if e not in integer]


def _compile_quantized(model, x, **quantize):
    torch.manual_seed(0)
    quantized = quantize_pt2e(model, x, **quantize)
    with torch.no_grad():
        expected, float_out = quantized(x), model(x)
        actual = assert_matches_eager(quantized, x, options={"cache": False}, rtol=0, atol=1.0)
    return quantized, expected, float_out, actual, tori.last_compile().graphs[-1]


def _within_quantization(actual, expected, float_out):
    """tori's int8 result differs from eager's int8 model by rounding ties of the
    intermediate requantizations at most: far less than int8's own error."""
    error = (expected - float_out).abs().max().item()
    difference = (actual - expected).abs()
    assert difference.max().item() <= error, (difference.max().item(), error)
    assert difference.mean().item() <= 0.1 * (expected - float_out).abs().mean().item() + 1e-6


@pytest.mark.parametrize("model,shape,per_channel", [(MLP, (16, 64), True), (MLP, (16, 64), False),
                                                     (Tokens, (2, 64, 8), True)],
                         ids=["per-channel", "per-tensor", "tokens"])
def test_pt2e_linear_layers_run_integer_matmuls(model, shape, per_channel):
    """Linear layers of 2-D inputs, and of 3-D ones (a transformer's tokens: rows of
    the input reshaped after its dequantize, which left Torch-MLIR's matmul float32)."""
    torch.manual_seed(0)
    net, x = model().eval(), torch.randn(*shape)
    _, expected, float_out, actual, graph = _compile_quantized(net, x, per_channel=per_channel)
    _within_quantization(actual, expected, float_out)
    integer, other = _integer_matmuls(graph)
    layers = sum(isinstance(m, torch.nn.Linear) for m in net.modules())
    assert len(integer) == layers and not other, (integer, other)


def test_pt2e_convolutions_run_integer_matmuls():
    torch.manual_seed(0)
    model, x = CNN().eval(), torch.randn(2, 3, 20, 18)
    _, expected, float_out, actual, graph = _compile_quantized(model, x)
    _within_quantization(actual, expected, float_out)
    assert "aten.convolution" not in graph.stages["aten"]
    integer, other = _integer_matmuls(graph)
    # four convolutions and the classifier, all int8 x int8 -> int32
    assert len(integer) == 5 and not other, (integer, other)
    # the five int8 weights are module globals; their packing and the row sums of their
    # zero-point corrections run once, in the module's initializers, not per call
    flow = recorded_flow_ir(graph)
    weights = re.findall(r"util\.global private @\w+ = #stream\.parameter\.named<[^>]+> : tensor<([0-9x]+)xi8>", flow)
    sizes = sorted(math.prod(int(d) for d in w.split("x")) for w in weights)
    assert sizes == sorted(p.numel() for name, p in model.named_parameters() if name.endswith("weight")), weights
    per_call = [e for e in dispatches_of(flow).entries if not e.startswith("_initializer")]
    assert not [e for e in per_call if "encode" in e or re.search(r"reduction_(16x27|32x144|32x32|32x288|10x32)_", e)]


def test_uint8_activations_become_int8_exactly():
    def fn(x):
        q = qd.quantize_per_tensor.default(x, 0.05, 131, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor.default(q, 0.05, 131, 0, 255, torch.uint8)

    gm = torch.fx.symbolic_trace(fn)
    x = torch.randn(4, 50) * 4  # past both ends of the range
    before = gm(x)
    assert rewrite_quantized(gm) == 1
    quantize = next(n for n in gm.graph.nodes if n.target is qd.quantize_per_tensor.default)
    assert quantize.args[2:] == (3, -128, 127, torch.int8)
    assert torch.equal(gm(x), before)


def test_uint8_tensor_used_elsewhere_is_kept():
    def fn(x):
        q = qd.quantize_per_tensor.default(x, 0.05, 131, 0, 255, torch.uint8)
        return qd.dequantize_per_tensor.default(q, 0.05, 131, 0, 255, torch.uint8), q

    gm = torch.fx.symbolic_trace(fn)
    assert rewrite_quantized(gm) == 0


@pytest.mark.parametrize("stride,padding,dilation,per_channel,bias,batch", [
    ((1, 1), (1, 1), (1, 1), True, True, 2),
    ((2, 1), (0, 2), (1, 1), True, False, 1),
    ((1, 2), (2, 1), (2, 1), False, True, 3),
])
def test_quantized_conv2d_is_the_dequantized_convolution(stride, padding, dilation, per_channel, bias, batch):
    torch.manual_seed(0)
    q_input = torch.randint(-128, 128, (batch, 5, 11, 9), dtype=torch.int8)
    q_weight = torch.randint(-127, 128, (7, 5, 3, 2), dtype=torch.int8)
    scale, zero = 0.02, -7
    if per_channel:
        w_scale, w_zero = torch.rand(7) * 0.01 + 1e-3, torch.zeros(7, dtype=torch.int64)
        weight = qd.dequantize_per_channel.default(q_weight, w_scale, w_zero, 0, -128, 127, torch.int8)
    else:
        w_scale, w_zero = 0.004, 0
        weight = qd.dequantize_per_tensor.default(q_weight, w_scale, w_zero, -128, 127, torch.int8)
    b = torch.randn(7) if bias else None
    x = qd.dequantize_per_tensor.default(q_input, scale, zero, -128, 127, torch.int8)
    expected = F.conv2d(x, weight, b, stride, padding, dilation)
    actual = quantized_conv2d(q_input, scale, zero, -128, 127, q_weight, w_scale, w_zero, -128, 127, per_channel, b,
                              list(stride), list(padding), list(dilation))
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def _grouped_operands(dtype, per_channel_zero, batch):
    torch.manual_seed(0)
    low, high = (-128, 127) if dtype == torch.int8 else (0, 255)
    q_input = torch.randint(low, high + 1, (batch, 12, 11, 9), dtype=dtype)
    q_weight = torch.randint(-128, 128, (12, 3, 3, 2), dtype=torch.int8)
    w_scale = torch.rand(12) * 0.01 + 1e-3
    w_zero = torch.randint(-5, 6, (12,)) if per_channel_zero else torch.zeros(12, dtype=torch.int64)
    return q_input, q_weight, w_scale, w_zero, (low, high)


@pytest.mark.parametrize("dtype,per_channel_zero,batch,dynamic", [
    (torch.int8, False, 2, False), (torch.uint8, True, 1, False), (torch.uint8, True, 3, True),
], ids=["int8", "uint8-weight-zero-points", "per-call"])
def test_int8_grouped_conv2d_is_the_dequantized_convolution(dtype, per_channel_zero, batch, dynamic):
    """The grouped form sums the integers exactly: it equals the convolution of the
    dequantized operands computed in float64, to float32's rounding of the result."""
    q_input, q_weight, w_scale, w_zero, (low, high) = _grouped_operands(dtype, per_channel_zero, batch)
    scale, zero = (torch.tensor([0.03], dtype=torch.float64), torch.tensor([low + 9])) if dynamic else (0.03, low + 9)
    geometry = ([2, 1], [1, 2], [1, 2])
    x = (q_input.double() - float(zero)) * float(scale)
    w = (q_weight.double() - w_zero.reshape(12, 1, 1, 1)) * w_scale.double().reshape(12, 1, 1, 1)
    bias = torch.randn(12)
    expected = F.conv2d(x, w, bias.double(), *geometry, groups=4)
    actual = int8_grouped_conv2d(q_input, scale, zero, dtype, q_weight, w_scale, w_zero, bias, *geometry, 4)
    torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dynamic", [False, True], ids=["constant", "per-call"])
def test_int8_depthwise_conv2d_is_the_dequantized_convolution(dynamic):
    torch.manual_seed(0)
    q_input = torch.randint(0, 256, (2, 8, 10, 13), dtype=torch.uint8)
    q_weight = torch.randint(-128, 128, (8, 1, 7, 7), dtype=torch.int8)
    w_scale, w_zero = torch.rand(8) * 0.01 + 1e-3, torch.randint(-5, 6, (8,))
    scale, zero = (torch.tensor([0.05], dtype=torch.float64), torch.tensor([200])) if dynamic else (0.05, 200)
    x = (q_input.double() - float(zero)) * float(scale)
    w = (q_weight.double() - w_zero.reshape(8, 1, 1, 1)) * w_scale.double().reshape(8, 1, 1, 1)
    expected = F.conv2d(x, w, None, 2, 3, 1, groups=8)
    actual = int8_depthwise_conv2d(q_input, scale, zero, q_weight, w_scale, w_zero, None, [2, 2], [3, 3], [1, 1])
    torch.testing.assert_close(actual.double(), expected, rtol=1e-6, atol=1e-6)


def test_one_row_int8_linear_is_an_int_mm():
    """A static int8 linear layer of one row (a classifier at batch 1) is tori's
    `_int_mm` form, as dynamic ones are: Torch-MLIR's own form of it made ResNet-18's
    data-tiled compile fail (below)."""
    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(1, 64)
    _, expected, float_out, actual, graph = _compile_quantized(model, x)
    _within_quantization(actual, expected, float_out)
    assert graph.stages["aten"].count("aten._int_mm") == 3
    integer, other = _integer_matmuls(graph)
    assert len(integer) == 3 and not other, (integer, other)


@pytest.mark.extended
def test_int8_resnet18_compiles_with_the_first_data_tiling_path():
    """An int8 ResNet-18 at batch 1 compiles with the code generation rules' own flags:
    its classifier in Torch-MLIR's form failed IREE's data tiling ("'iree_linalg_ext.
    map_store' op write affecting operations on global resources ...") and the graph was
    compiled again with IREE's global-optimization data tiling, which fuses less."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from real_models import REAL_MODELS

    resnet = REAL_MODELS["resnet18"]
    model, inputs = resnet.build(), resnet.inputs(1)
    quantized = quantize_pt2e(model, *inputs, calibration=1)
    with torch.no_grad():
        expected = quantized(*inputs)
        actual = torch.compile(quantized, backend="tori", options={"fallback": "error", "cache": False})(*inputs)
    assert (actual - expected).abs().max().item() <= (expected - model(*inputs)).abs().max().item()
    flags = tori.last_compile().graphs[-1].iree_invocation.flags
    assert "--iree-opt-data-tiling=true" in flags and "--iree-global-opt-data-tiling" not in flags, flags


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_pt2e_grouped_convolutions_run_integer_arithmetic(dynamic):
    """Grouped convolutions with several channels per group (and channel multipliers)
    run one batched int8 matmul; depthwise ones sum their integer products exactly in
    tori's float32 channels-last kernel. Neither reaches IREE as a quantized
    convolution (its lowering made an int8 MobileNetV3 2.9x slower than the float one)."""
    torch.manual_seed(0)
    model, x = Grouped().eval(), torch.randn(2, 3, 16, 14)
    quantized = quantize_pt2e(model, x, dynamic=dynamic)
    with torch.no_grad():
        expected, float_out = quantized(x), model(x)
        actual = assert_matches_eager(quantized, x, options={"cache": False}, rtol=0, atol=1e-4 if dynamic else 1.0)
    graph = tori.last_compile().graphs[-1]
    if not dynamic:
        _within_quantization(actual, expected, float_out)
    integer, others = _integer_matmuls(graph)
    # the 1x1, the grouped, the multiplier's and the classifier: integer matmuls; the
    # depthwise one: one float32 convolution of integers
    assert len(integer) == 4, (integer, others)
    assert len(others) == 1 and re.search(r"_conv_2x8x7x32x5x5_f32$", others[0]), others
    assert "i8xi8xi32" not in " ".join(e for e in dispatches_of(recorded_flow_ir(graph)).entries if "_conv_" in e)


def test_int8_activations_stay_channels_last_between_convolutions():
    """The int8 convolutions compute on channels-last rows; their NCHW results are
    permutes that tori moves past the elementwise ops between them (bias, activation,
    requantization, the squeeze-excitation gate, the residual add), where they cancel
    against the next convolution's. Before, each block wrote its activations back to
    NCHW and read them transposed again: five transposing dispatches per call here,
    1.3 ms of an int8 EfficientNet-B0's 6.6 ms of dispatches."""
    torch.manual_seed(0)
    model, x = MobileNetLike().eval(), torch.randn(1, 3, 24, 24)
    _, expected, float_out, actual, graph = _compile_quantized(model, x)
    _within_quantization(actual, expected, float_out)
    per_call = [e for e in dispatches_of(recorded_flow_ir(graph)).entries if not e.startswith("_initializer")]
    # the one left: the NCHW input quantized to channels-last int8 (the float32 model's too)
    transposing = [e for e in per_call if "transpose" in e]
    assert len(transposing) == 1 and re.search(r"transpose_3x24x24_f32xi8$", transposing[0]), transposing


def _artifact_bytes(folder) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and "examples" not in f.parts)


def test_exported_int8_model_runs_without_pytorch_and_is_a_quarter_the_size(tmp_path):
    torch.manual_seed(0)
    model, x = WideMLP().eval(), torch.randn(8, 512)
    quantized = quantize_pt2e(model, x)
    with torch.no_grad():
        expected = quantized(x)
        compiled = torch.compile(quantized, backend="tori", options={"fallback": "error"})(x)
    int8 = tori.export(quantized, (x,), output_dir=tmp_path / "int8", external_weights=True)
    float32 = tori.export(model, (x,), output_dir=tmp_path / "float32", external_weights=True)
    assert _artifact_bytes(int8) <= 0.3 * _artifact_bytes(float32), (_artifact_bytes(int8), _artifact_bytes(float32))

    manifest = json.loads((int8 / "manifest.json").read_text())
    entries = manifest["parameters"]["entries"]
    assert not [k for k, v in entries.items() if v["dtype"] == "float32" and k.endswith("weight")]  # float weights dropped
    assert sorted(v["shape"] for v in entries.values() if v["dtype"] == "int8") == [[10, 1024], [1024, 512], [1024, 1024]]
    quantization = manifest["entry_points"]["forward"]["quantization"]
    weights = [q for q in quantization if q["op"] == "dequantize_per_channel"]
    assert len(weights) == 3 and all(q["dtype"] == "int8" and q["scale"] in entries and q["axis"] == 0 for q in weights)
    assert [q["dtype"] for q in quantization if q["tensor"] == "activation"] == ["int8"] * 3

    loaded = tori.runtime.load(int8)
    torch.testing.assert_close(torch.from_numpy(loaded(x.numpy())), compiled, rtol=0, atol=1e-5)
    torch.testing.assert_close(compiled, expected, rtol=0, atol=1e-2)

    # iree-run-module, IREE's own tool, with the parameter archive
    np.save(tmp_path / "x.npy", x.numpy())
    done = subprocess.run([str(Path(sys.executable).parent / "iree-run-module"), f"--module={int8 / 'cpu.vmfb'}", "--device=local-task",
                           f"--parameters=model={int8 / 'parameters.irpa'}", "--function=forward",
                           f"--input=@{tmp_path / 'x.npy'}", f"--output=@{tmp_path / 'out.npy'}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "out.npy")), compiled, rtol=0, atol=1e-5)


@pytest.mark.parametrize("model,shape", [(MLP, (16, 64)), (CNN, (2, 3, 20, 18))], ids=["mlp", "cnn"])
def test_bf16_autocast_compiles_and_matches_eager_autocast(model, shape):
    torch.manual_seed(0)
    net, x = model().eval(), torch.randn(*shape)

    def forward(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return net(x)

    with torch.no_grad():
        out = assert_matches_eager(forward, x, rtol=2e-2, atol=2e-2)
    assert out.dtype == torch.bfloat16  # the classifier's matmul ran in bf16, as eager's autocast does
    graph = tori.last_compile().graphs[-1]
    assert "bf16" in graph.stages["torch"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_models_cast_to_16_bit_floats_match_eager(dtype):
    torch.manual_seed(0)
    net, x = CNN().eval().to(dtype), torch.randn(2, 3, 20, 18, dtype=dtype)
    with torch.no_grad():
        out = assert_matches_eager(net, x, rtol=3e-2, atol=3e-2)
    assert out.dtype == dtype


def test_cpu_features_say_which_16_bit_floats_have_arithmetic():
    assert float16_types_without_arithmetic("nehalem") == {"bf16", "f16"}    # SSE 4.2
    assert float16_types_without_arithmetic("znver3") == {"bf16"}            # AVX2, FMA and F16C
    assert float16_types_without_arithmetic("znver4") == frozenset()         # AVX-512 BF16
    assert "+avx2" in cpu_features("znver3") and "+avx512f" not in cpu_features("znver3")


def test_bf16_matmuls_for_a_cpu_without_bf16_arithmetic_are_widened_to_float32():
    """Compiled for Zen 3 (no bf16 instructions; its code runs on any AVX2 CPU), the
    wide MLP's bf16 matmuls under autocast are float32 contractions of widened operands:
    IREE's bf16 form ran one scalar multiply-add per product there, 92x the float32
    model's time. The result is still bf16 and matches eager's autocast."""
    torch.manual_seed(0)
    net, x = WideMLP().eval(), torch.randn(16, 512)

    def forward(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return net(x)

    with torch.no_grad():
        out = assert_matches_eager(forward, x, rtol=2e-2, atol=2e-2, options={"cpu": "znver3", "cache": False})
    assert out.dtype == torch.bfloat16
    contractions = [e for e in dispatches_of(recorded_flow_ir(tori.last_compile().graphs[-1])).entries
                    if "matmul" in e]
    assert len(contractions) == 3 and all(e.endswith("_f32") for e in contractions), contractions


def _int8_weight_only(model):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    quantize_(model, Int8WeightOnlyConfig())
    return model


@pytest.mark.parametrize("rows,block", [(1, 64), (4, 16)], ids=["matvec", "matmul"])
def test_weight_only_int8_linear_layers_read_int8_weights(rows, block):
    """Each layer is one contraction over its int8 weight, packed once in blocks: of 64
    rows for a CPU matvec (one cache line per step along K, a decoding step's form),
    of 16 otherwise."""
    torch.manual_seed(0)
    model = _int8_weight_only(MLP().eval())
    x = torch.randn(rows, 64)
    with torch.no_grad():
        assert_matches_eager(model, x, options={"cache": False}, rtol=1e-5, atol=1e-5)
    graph = tori.last_compile().graphs[-1]
    entries = dispatches_of(recorded_flow_ir(graph)).entries
    per_call = [e for e in entries if not e.startswith("_initializer")]
    # one contraction per layer reading the int8 weight; no per-call widening,
    # transpose or packing of a weight: the initializer packs them, in blocks
    assert len([e for e in per_call if re.search(r"mat(mul|vec)_like_[\dx]+_f32xi8xf32$", e)]) == 3, per_call
    flow = recorded_flow_ir(graph)
    other = 16 if block == 64 else 64
    assert len(re.findall(rf"inner_tiles = \[{block}\]", flow)) == 3 and f"inner_tiles = [{other}]" not in flow
    assert not [e for e in per_call if re.search(r"(elementwise_.*i8xf32|transpose.*i8|pack_i8)$", e)], per_call
    assert len([e for e in entries if e.startswith("_initializer") and e.endswith("pack_i8")]) == 3, entries
    # the layers' zero points (read by nothing) are not passed on each call; the weights
    # and scales are module globals
    kinds = graph.compiled.signature.args
    assert kinds.count(ArgKind.UNUSED) == 3 and kinds.count(ArgKind.RESIDENT) == 9, kinds


def test_weight_only_int8_decoding_gives_eager_tokens():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = _int8_weight_only(transformers.LlamaForCausalLM(config).eval())
    prompt = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    settings = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, cache_implementation="static", pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, **settings)
        model.forward = torch.compile(model.forward, backend="tori", options={"fallback": "error"})
        with count_graphs() as count:
            actual = model.generate(prompt, **settings)
    assert torch.equal(actual, expected)
    assert count.compiled_graphs >= 2 and count.fallback_graphs == 0 and count.compiled_calls >= 8


@pytest.mark.parametrize("model,shape", [(MLP, (16, 64)), (Tokens, (2, 64, 8)), (CNN, (2, 3, 20, 18))],
                         ids=["mlp", "tokens", "cnn"])
def test_dynamic_activation_quantization_matches_eager(model, shape):
    """Scales and zero points computed per call (choose_qparams) compile, with eager's
    arithmetic: the same values to float32 rounding; linear layers (of 2-D inputs, and
    of 3-D ones, contiguous or not, as a transformer's tokens) and convolutions (the CNN's strides, padding
    and dilation, its input padded with the per-call zero point) run integer matmuls."""
    torch.manual_seed(0)
    net, x = model().eval(), torch.randn(*shape)
    quantized = quantize_pt2e(net, x, dynamic=True)
    with torch.no_grad():
        assert_matches_eager(quantized, x, options={"cache": False}, rtol=0, atol=1e-5)
        graph = tori.last_compile().graphs[-1]
        # a second input with another range: its scale is computed again, not baked in
        assert_matches_eager(quantized, torch.randn(*shape) * 5, rtol=0, atol=1e-4)
    assert "choose_qparams" not in graph.stages["aten"]
    integer, others = _integer_matmuls(graph)
    layers = sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) for m in net.modules())
    assert len(integer) == layers and not others, (integer, others)


def test_exported_dynamic_int8_model_runs_without_pytorch(tmp_path):
    """A dynamically quantized CNN with per-tensor weights: compiled with integer
    matmuls, exported, and run by the torch-free runtime with the compiled results; the
    manifest records the per-call activation quantization and the int8 weights."""
    torch.manual_seed(0)
    net, x = CNN().eval(), torch.randn(2, 3, 20, 18)
    quantized = quantize_pt2e(net, x, dynamic=True, per_channel=False)
    with torch.no_grad():
        compiled = assert_matches_eager(quantized, x, options={"cache": False}, rtol=0, atol=1e-5)
    integer, others = _integer_matmuls(tori.last_compile().graphs[-1])
    assert len(integer) == 5 and not others, (integer, others)

    artifact = tori.export(quantized, (x,), output_dir=tmp_path / "dynamic", external_weights=True)
    loaded = tori.runtime.load(artifact)
    torch.testing.assert_close(torch.from_numpy(loaded(x.numpy())), compiled, rtol=0, atol=1e-5)
    quantization = json.loads((artifact / "manifest.json").read_text())["entry_points"]["forward"]["quantization"]
    activations = [q for q in quantization if q["tensor"] == "activation"]
    weights = [q for q in quantization if q["tensor"] != "activation"]
    assert len(activations) == 5 and all(q["scale"] == q["zero_point"] == "computed" for q in activations), activations
    assert len(weights) == 5 and all(q["dtype"] == "int8" and isinstance(q["scale"], float) for q in weights), weights
