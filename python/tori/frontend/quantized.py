"""Quantized graphs (PyTorch 2 export quantization, `quantized_decomposed` ops) in the
forms that reach IREE as integer contractions. A rewrite of the functional ATen graph
before import (torch.compile's and tori.export's): both rewrites change the ops a
contraction's operands come from, which a decomposition (seeing one op's inputs)
cannot. Replacements are traced to ATen ops (make_fx) and spliced in, so the graph
stays one of ATen ops with their metadata.

Torch-MLIR fuses `mm(dequantize(x), dequantize(w))` into an integer matmul with the
zero points subtracted and the scales applied after (i8 x i8 -> i32); IREE data-tiles
it for the CPU's integer dot-product instructions. These forms escape it:

- uint8 activations (X86InductorQuantizer's default): the matmul becomes a generic
  of `extui` and `extsi` operands that IREE neither data-tiles nor gives a kernel
  (74 GOP/s for a 64x1024x512 one, against 548 for int8 x int8 and 266 GFLOP/s for
  float32; docs/quantization.md). An activation quantized to uint8 with zero point
  z is the same tensor quantized to int8 with zero point z - 128, shifted by 128: the
  pair's arguments are rewritten (exact).
- 2-D convolutions: Torch-MLIR fuses a convolution only with per-tensor weights, and
  PT2E quantizes weights per channel; the convolution then ran in float32 on
  dequantized operands. It becomes im2col of the int8 input (padded with the input's
  zero point, which dequantizes to 0), built channels-last, and one matmul against
  the int8 weight as [O, kh*kw*C], each operand dequantized just before the matmul;
  its NCHW result is a permute of the rows, which frontend/channels_last.py moves
  past the elementwise ops to the next convolution's permute, where both go.
- a linear layer of one row with constant activation parameters (a classifier at
  batch 1): Torch-MLIR's form folded the row's zero-point correction into the
  data-tiled accumulator, whose dispatch IREE failed to compile ("'iree_linalg_ext.
  map_store' op write affecting operations on global resources ..."), and the whole
  graph (an int8 ResNet-18's) was compiled again with IREE's global-optimization data
  tiling, which fuses less. It becomes `int8_linear`, as dynamic ones do.
- linear layers of more than two dimensions (a transformer's tokens): the input is
  reshaped to rows after its dequantize, which kept Torch-MLIR's matmul float32. The
  reshape moves before the dequantize (`quantized_linear_as`).
- grouped 2-D convolutions: Torch-MLIR made a depthwise one an integer convolution
  that IREE lowered to a generic along the wrong dimension (an int8 MobileNetV3 ran
  2.9x slower than the float one), and tori's decomposition of grouped ones (the taps
  of their windows, frontend/decomp/grouped_conv.py) computed in float32. A grouped
  one becomes im2col per group and one batched int8 matmul; a depthwise one the
  convolution of its integers less their zero points in float32, which holds every
  sum of its products exactly, so that tori's channels-last depthwise kernel runs
  it (of the float32 values' integers directly, where the int8 tensor is made for it
  alone). The decomposition leaves both whole for this rewrite.
- static quantization (`quantize_per_tensor` with number parameters): Torch-MLIR's
  lowering divides by the scale; it becomes eager's formula, times the inverse scale.
- dynamic activation quantization (scale and zero point computed per call by
  `choose_qparams.tensor`, passed as tensors): Torch-MLIR imports none of these ops
  (IREE failed on `choose_qparams`) and their PyTorch kernels read the tensors with
  `.item()`. A linear layer (`mm` of a per-call dequantized activation, or of one of
  more dimensions flattened to rows, and an int8 weight) becomes `torch._int_mm` with
  the zero-point corrections and scales applied after, and a 2-D convolution the same
  after im2col (the input padded with its per-call zero point); the ops left become
  formulas in torch ops with eager's arithmetic.

Weight-only quantization (int8 weights widened to float before a float matmul) is
tori-int8-weight-matmul's (passes/int8_weight_matmul.py).

Never changes: quantize/dequantize pairs whose quantized tensor is used otherwise
(returned, or read by other ops), transposed convolutions, grouped ones whose sums
float32 would not hold exactly (more than 1023 products per group, or 258 taps per
depthwise window), and graphs without these ops. Matmuls of two quantized
activations (a bmm) run in float32 on the dequantized values.
"""

from __future__ import annotations

import functools
import logging
import math
import operator

import torch
import torch.fx

from tori.aot.parameters import dtype_name
from tori.frontend.channels_last import TO_NCHW, TO_NHWC, sink_channel_permutes
from tori.frontend.splice import fake_mode_of, is_call, splice_traced, static_shape, value_of

log = logging.getLogger("tori.frontend.quantized")

aten = torch.ops.aten


def _ops():
    """The `quantized_decomposed` ops, or None where torch has not registered them."""
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the ops)
        return torch.ops.quantized_decomposed
    except (ImportError, AttributeError):
        return None


def _signed_activations(gm: torch.fx.GraphModule, qd) -> int:
    """uint8 per-tensor quantize -> dequantize pairs with constant scale and zero point
    made int8, when every user of the quantized tensor is such a dequantize."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if not is_call(node, qd.quantize_per_tensor.default) or len(node.args) != 6 or node.kwargs:
            continue
        _, scale, zero, low, high, dtype = node.args
        if dtype != torch.uint8 or (low, high) != (0, 255) or not isinstance(scale, float) or not isinstance(zero, int):
            continue
        users = list(node.users)
        if not users or not all(is_call(u, qd.dequantize_per_tensor.default) and tuple(u.args[1:6]) == tuple(node.args[1:6])
                                and not u.kwargs for u in users):
            continue
        signed = (zero - 128, -128, 127, torch.int8)
        node.args = (node.args[0], scale, *signed)
        _retype(node, torch.int8)
        for user in users:
            user.args = (node, scale, *signed, *user.args[6:])
        rewritten += 1
    return rewritten


def _padded(q_input: torch.Tensor, pad_value, kh: int, kw: int, stride, padding, dilation,
            channels_last: bool = False) -> tuple:
    """A quantized NCHW input padded with `pad_value` (its zero point, a number or a
    one-element tensor), or its channels-last permutation padded with `channels_last`;
    and (batch, out_h, out_w) of the windows over it."""
    batch, channels, height, width = q_input.shape
    (ph, pw) = padding
    out_h, out_w = (_windows(size + 2 * p, k, s, d) for size, p, k, s, d in zip(
        (height, width), padding, (kh, kw), stride, dilation))
    padded = q_input.permute(TO_NHWC) if channels_last else q_input
    border = [0, 0, pw, pw, ph, ph] if channels_last else [pw, pw, ph, ph]
    if (ph or pw) and isinstance(pad_value, torch.Tensor):  # a per-call zero point: the border set after padding
        inside = aten.constant_pad_nd.default(torch.ones(height, width, dtype=torch.bool), [pw, pw, ph, ph], 0)
        padded = torch.where(inside.unsqueeze(-1) if channels_last else inside,
                             aten.constant_pad_nd.default(padded, border, 0), pad_value.to(q_input.dtype))
    elif ph or pw:
        padded = aten.constant_pad_nd.default(padded, border, pad_value)
    return padded, (batch, out_h, out_w)


def _windows(size: int, kernel: int, stride: int, dilation: int) -> int:
    """How many windows fit along a padded dimension of `size`."""
    return (size - dilation * (kernel - 1) - 1) // stride + 1


def _window_views(padded: torch.Tensor, kh: int, kw: int, stride, dilation, out_h: int, out_w: int) -> list:
    """The kh*kw strided views of an NCHW `padded` that the windows read."""
    (sh, sw), (dh, dw) = stride, dilation
    lead = (slice(None),) * 2
    return [padded[(*lead, slice(i * dh, i * dh + sh * (out_h - 1) + 1, sh),
                    slice(j * dw, j * dw + sw * (out_w - 1) + 1, sw))]
            for i in range(kh) for j in range(kw)]


def gathered_windows(padded: torch.Tensor, kernel, stride, dilation) -> torch.Tensor:
    """The windows over a padded channels-last [N, H, W, C] input in one indexing op:
    [N, OH, OW, kh, kw, C].

    IREE makes it one gather dispatch where the kh*kw strided views stacked were a copy
    dispatch each, and an executable each to compile: ResNet-18 at one image 97 -> 45
    dispatches a call, its iree-compile 3.7 -> 2.8 s, the same speed (docs/performance.md).
    Padding inside the gather (positions clamped, the border selected) compiled slower
    and ran slower than the padded input's own dispatch: 3.3-3.7 s against 2.4. The
    positions come from arange (see decomp/pooling.py's `_windows`)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    if (kh, kw) == (1, 1):  # a window is a pixel: a strided view
        return padded[:, ::sh, ::sw, None, None, :]

    def positions(size: int, k: int, step: int, spread: int) -> torch.Tensor:
        """(windows, k): each window's positions along a padded dimension."""
        starts = torch.arange(_windows(size, k, step, spread), device=padded.device).reshape(-1, 1) * step
        return starts + torch.arange(k, device=padded.device) * spread

    rows, cols = positions(padded.shape[1], kh, sh, dh), positions(padded.shape[2], kw, sw, dw)
    return padded[:, rows.reshape(rows.shape[0], 1, kh, 1), cols.reshape(1, cols.shape[0], 1, kw)]


def _columns(q_input: torch.Tensor, pad_value, kh: int, kw: int, stride, padding, dilation) -> tuple:
    """im2col of a quantized NCHW input padded with `pad_value`, built channels-last:
    rows (n, oh, ow), columns in (kh, kw, c) order (`_flat_weight`'s); and (batch,
    out_h, out_w)."""
    padded, shape = _padded(q_input, pad_value, kh, kw, stride, padding, dilation, channels_last=True)
    return gathered_windows(padded, (kh, kw), stride, dilation).reshape(math.prod(shape), -1), shape


def _flat_weight(q_weight: torch.Tensor) -> torch.Tensor:
    """A convolution's [O, C, kh, kw] weight as [O, kh*kw*C], the order of `_columns`."""
    return q_weight.permute(0, 2, 3, 1).reshape(q_weight.shape[0], -1)


def _to_nchw(rows: torch.Tensor, shape: tuple, bias: torch.Tensor | None) -> torch.Tensor:
    """A convolution's [n*oh*ow, o] matmul result plus its bias, as NCHW: a permute of
    channels-last values, which `sink_channel_permutes` moves past elementwise ops."""
    rows = rows if bias is None else rows + bias
    return rows.reshape(*shape, rows.shape[1]).permute(TO_NCHW)


def quantized_conv2d(q_input: torch.Tensor, input_scale: float, input_zero: int, input_low: int, input_high: int,
                     q_weight: torch.Tensor, weight_scale, weight_zero, weight_low: int, weight_high: int,
                     per_channel: bool, bias: torch.Tensor | None, stride, padding, dilation) -> torch.Tensor:
    """conv2d(dequantize(q_input), dequantize(q_weight)) + bias as im2col of the int8
    input and one matmul of dequantized operands, which Torch-MLIR makes an integer one."""
    qd = torch.ops.quantized_decomposed
    kh, kw = q_weight.shape[2:]
    columns, shape = _columns(q_input, input_zero, kh, kw, stride, padding, dilation)
    x = qd.dequantize_per_tensor.default(columns, input_scale, input_zero, input_low, input_high, torch.int8)
    flat = _flat_weight(q_weight)
    if per_channel:
        w = qd.dequantize_per_channel.default(flat, weight_scale, weight_zero, 0, weight_low, weight_high, torch.int8)
    else:
        w = qd.dequantize_per_tensor.default(flat, weight_scale, weight_zero, weight_low, weight_high, torch.int8)
    return _to_nchw(torch.mm(x, w.permute(1, 0)), shape, bias)


def dynamic_int8_conv2d(q_input: torch.Tensor, input_scale: torch.Tensor, input_zero: torch.Tensor,
                        input_dtype: torch.dtype, q_weight: torch.Tensor, weight_scale, weight_zero,
                        bias: torch.Tensor | None, stride, padding, dilation) -> torch.Tensor:
    """conv2d(dequantize(q_input), dequantize(q_weight)) + bias for an activation quantized
    per call: im2col of the quantized input (padded with its zero point, which
    dequantizes to 0) and `int8_linear` against the weight as [O, kh*kw*C]."""
    kh, kw = q_weight.shape[2:]
    columns, shape = _columns(q_input, input_zero, kh, kw, stride, padding, dilation)
    rows = int8_linear(columns, input_scale, input_zero, input_dtype, _flat_weight(q_weight), weight_scale,
                       weight_zero)
    return _to_nchw(rows, shape, bias)


def _as_int8(q_input: torch.Tensor, zero_point, dtype: torch.dtype) -> tuple:
    """An activation quantized to uint8 as the same values quantized to int8: shifted
    by 128, and its zero point (a number or a tensor) with it; int8 ones as they are."""
    if dtype != torch.uint8:
        return q_input, zero_point
    return (q_input.to(torch.int16) - 128).to(torch.int8), zero_point - 128


def _scaled(accumulated: torch.Tensor, input_scale, weight_scale, shape: tuple) -> torch.Tensor:
    """An exact integer result (int32, or float32 holding integers) times the input's
    scale (a number or a one-element tensor) and the weight's (a number, or a tensor of
    one per output channel, in `shape`)."""
    scale = input_scale.to(torch.float32) if isinstance(input_scale, torch.Tensor) else float(input_scale)
    if isinstance(weight_scale, torch.Tensor):
        scale = scale * weight_scale.to(torch.float32).reshape(shape)
    else:
        scale = scale * float(weight_scale)
    return accumulated.to(torch.float32) * scale


def _zero(zero_point, dtype: torch.dtype, shape: tuple = ()):
    """A zero point (a number, or a tensor: one element, or one per output channel
    in `shape`) as `dtype`."""
    return zero_point.to(dtype).reshape(shape) if isinstance(zero_point, torch.Tensor) else zero_point


def int8_depthwise_conv2d(q_input: torch.Tensor, input_scale, input_zero, q_weight: torch.Tensor, weight_scale,
                          weight_zero, bias: torch.Tensor | None, stride, padding, dilation) -> torch.Tensor:
    """conv2d(dequantize(q_input), dequantize(q_weight)) + bias with one input and one
    output channel per group: the products of the integers less their zero points
    summed in float32, which holds each sum exactly (`_INTEGER_DEPTHWISE`), by tori's
    channels-last depthwise kernel (passes/depthwise_nhwc.py); the scales after. The
    input is padded with zeros after its zero point is subtracted: with the zero point."""
    x = q_input.to(torch.float32) - _zero(input_zero, torch.float32)
    return _depthwise_of_integers(x, input_scale, q_weight, weight_scale, weight_zero, bias, stride, padding, dilation)


def requantized_depthwise_conv2d(values: torch.Tensor, input_scale: float, input_zero: int, input_low: int,
                                 input_high: int, q_weight: torch.Tensor, weight_scale, weight_zero,
                                 bias: torch.Tensor | None, stride, padding, dilation) -> torch.Tensor:
    """`int8_depthwise_conv2d` of float32 `values` quantized with constant parameters
    that nothing else reads quantized: their integers less the zero point, computed in
    float32 (the same integers) without the int8 tensor between, which IREE converted
    back to float32 in a dispatch of its own before each depthwise convolution."""
    x = quantize_per_tensor_default(values, input_scale, input_zero, input_low, input_high, torch.float32) \
        - float(input_zero)
    return _depthwise_of_integers(x, input_scale, q_weight, weight_scale, weight_zero, bias, stride, padding, dilation)


def _depthwise_of_integers(x: torch.Tensor, input_scale, q_weight: torch.Tensor, weight_scale, weight_zero,
                           bias: torch.Tensor | None, stride, padding, dilation) -> torch.Tensor:
    """The depthwise convolution of an input's integers less its zero point (float32)."""
    channels = q_weight.shape[0]
    w = q_weight.to(torch.float32) - _zero(weight_zero, torch.float32, (channels, 1, 1, 1))
    summed = aten.convolution.default(x, w, None, stride, padding, dilation, False, [0, 0], channels)
    # the scales and bias on channels-last values (the kernel's own layout), the result
    # a permute of them for `sink_channel_permutes`
    out = _scaled(summed.permute(TO_NHWC), input_scale, weight_scale, (channels,))
    return (out if bias is None else out + bias).permute(TO_NCHW)


def int8_grouped_conv2d(q_input: torch.Tensor, input_scale, input_zero, input_dtype: torch.dtype,
                        q_weight: torch.Tensor, weight_scale, weight_zero, bias: torch.Tensor | None, stride,
                        padding, dilation, groups: int) -> torch.Tensor:
    """conv2d(dequantize(q_input), dequantize(q_weight), groups=groups) + bias: im2col of
    the quantized input (padded with its zero point), one int8 x int8 -> int32 matmul
    per group over the batch's images in one batched matmul (IREE data-tiles it), the
    zero points' products subtracted with the operands' sums, the scales applied after. The matmul is that of
    the operands dequantized with scale 1 and zero point 0, which Torch-MLIR makes an
    integer one; its float32 result holds the integer sum exactly (`_INTEGER_GROUPED`)."""
    q_input, input_zero = _as_int8(q_input, input_zero, input_dtype)
    qd = torch.ops.quantized_decomposed
    outputs, per_group, kh, kw = q_weight.shape
    depth, group_outputs = per_group * kh * kw, outputs // groups
    padded, (batch, out_h, out_w) = _padded(q_input, input_zero, kh, kw, stride, padding, dilation)
    positions = out_h * out_w
    # columns [G, c*kh*kw, N*OH*OW]: a group's channels, each with its kh*kw taps, the
    # images side by side (Torch-MLIR's integer matmul is one of two 3-D operands)
    taps = _window_views(padded, kh, kw, stride, dilation, out_h, out_w)
    x = torch.stack(taps, 2).reshape(batch, groups, depth, positions).permute(1, 2, 0, 3)
    x = x.reshape(groups, depth, batch * positions)
    w = q_weight.reshape(groups, group_outputs, depth)
    as_integers = [qd.dequantize_per_tensor.default(t, 1.0, 0, -128, 127, torch.int8) for t in (w, x)]
    products = torch.matmul(*as_integers).to(torch.int32)  # [G, G's outputs, N*OH*OW]
    input_zero = _zero(input_zero, torch.int32)
    weight_zero = _zero(weight_zero, torch.int32, (groups, group_outputs, 1))
    # each window's sum over a group's channels: the padded input's sums over each
    # group's channels, summed over the window's taps
    group_sums = padded.reshape(batch, groups, per_group, *padded.shape[2:]).to(torch.int32).sum(2, dtype=torch.int32)
    window_sums = functools.reduce(operator.add, _window_views(group_sums, kh, kw, stride, dilation, out_h, out_w))
    window_sums = window_sums.permute(1, 0, 2, 3).reshape(groups, 1, batch * positions)
    weight_sums = w.to(torch.int32).sum(2, keepdim=True, dtype=torch.int32)
    exact = products - weight_zero * window_sums - input_zero * weight_sums + depth * input_zero * weight_zero
    out = _scaled(exact, input_scale, weight_scale, (groups, group_outputs, 1))
    out = out.reshape(outputs, batch, positions).permute(1, 0, 2).reshape(batch, outputs, out_h, out_w)
    return out if bias is None else out + bias.reshape(1, outputs, 1, 1)


# Grouped convolutions whose integer sums float32 holds exactly (below 2**24 in
# magnitude): a depthwise one sums kh*kw products of operands less their zero points
# (each at most 255 in magnitude); a grouped one's matmul c*kh*kw products of int8
# values (at most 128 in magnitude).
_INTEGER_DEPTHWISE = (2**24 - 1) // (255 * 255)
_INTEGER_GROUPED = (2**24 - 1) // (128 * 128)

def _pair(value, default: int) -> tuple[int, int] | None:
    value = default if value is None else value
    if isinstance(value, int):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return tuple(value)
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], int):
        return value[0], value[0]
    return None


def _conv_args(node: torch.fx.Node):
    """(input, weight, bias, stride, padding, dilation, groups) of a 2-D, not transposed
    convolution node, else None."""
    if is_call(node, aten.conv2d.default):
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        values = dict(zip(names, node.args))
        values.update(node.kwargs)
    elif is_call(node, aten.convolution.default) and len(node.args) == 9 and not node.kwargs:
        x, w, b, stride, padding, dilation, transposed, _, groups = node.args
        if transposed:
            return None
        values = {"input": x, "weight": w, "bias": b, "stride": stride, "padding": padding, "dilation": dilation,
                  "groups": groups}
    else:
        return None
    pairs = [_pair(values.get(k), d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1))]
    groups = values.get("groups", 1)
    if None in pairs or not isinstance(groups, int):
        return None
    return values["input"], values["weight"], values.get("bias"), *pairs, groups


def _rank(node) -> int | None:
    value = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None
    return value.dim() if isinstance(value, torch.Tensor) else None


def qd_op(name: str, overload: str = "default"):
    return getattr(getattr(torch.ops.quantized_decomposed, name), overload)


def _int8_weight(w) -> tuple | None:
    """(q_weight, scale, zero point, low, high, per_channel) of a float32 dequantize of an
    int8 tensor, per tensor or per channel along dim 0; else None."""
    if is_call(w, qd_op("dequantize_per_channel")) and len(w.args) >= 7 and not w.kwargs:
        q_weight, scale, zero, axis, low, high, dtype = w.args[:7]
        out_dtype, per_channel = w.args[7] if len(w.args) > 7 else None, True
        if axis != 0:
            return None
    elif is_call(w, qd_op("dequantize_per_tensor")) and len(w.args) >= 6 and not w.kwargs:
        q_weight, scale, zero, low, high, dtype = w.args[:6]
        out_dtype, per_channel = w.args[6] if len(w.args) > 6 else None, False
    else:
        return None
    if dtype != torch.int8 or out_dtype not in (None, torch.float32):
        return None
    return q_weight, scale, zero, low, high, per_channel


def _dynamic_input(x) -> tuple | None:
    """(q_input, scale, zero point, dtype) of a float32 dequantize of an activation
    quantized per call (scale and zero point tensors) to int8 or uint8's whole range."""
    if not is_call(x, qd_op("dequantize_per_tensor", "tensor")) or len(x.args) != 6 or x.kwargs.get("out_dtype") not in (
            None, torch.float32):
        return None
    q_input, scale, zero, low, high, dtype = x.args
    if (low, high) != {torch.int8: (-128, 127), torch.uint8: (0, 255)}.get(dtype):
        return None
    return q_input, scale, zero, dtype


_FULL_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


def _quantized_input(x) -> tuple | None:
    """(q_input, scale, zero point, dtype) of a float32 dequantize of an activation
    quantized per tensor to int8's or uint8's whole range, with constant parameters
    (numbers) or per call (tensors)."""
    dynamic = _dynamic_input(x)
    if dynamic is not None:
        return dynamic
    if not is_call(x, qd_op("dequantize_per_tensor")) or len(x.args) != 6 or x.kwargs:
        return None
    q_input, scale, zero, low, high, dtype = x.args
    if (low, high) != _FULL_RANGE.get(dtype) or not isinstance(scale, float) or not isinstance(zero, int):
        return None
    return q_input, scale, zero, dtype


def _requantized(q_input, dequantized, reader) -> tuple | None:
    """(values, scale, zero point, low, high) of a float32 tensor quantized per tensor
    with constant parameters into `q_input`, when only `dequantized` reads that and only
    `reader` reads `dequantized`; else None."""
    if not is_call(q_input, qd_op("quantize_per_tensor")) or len(q_input.args) != 6 or q_input.kwargs:
        return None
    values, scale, zero, low, high, dtype = q_input.args
    if list(q_input.users) != [dequantized] or list(dequantized.users) != [reader] or dtype != torch.int8 \
            or not isinstance(scale, float) or not isinstance(zero, int) \
            or getattr(value_of(values), "dtype", None) != torch.float32 \
            or tuple(dequantized.args[1:6]) != (scale, zero, low, high, dtype):
        return None
    return values, scale, zero, low, high


def grouped_form(x, weight, groups: int) -> tuple | None:
    """("depthwise" or "grouped", the input's quantization, the weight's) for a grouped
    convolution of these nodes that `_integer_convolutions` rewrites, else None."""
    found, int8_weight = _quantized_input(x), _int8_weight(weight)
    if groups == 1 or found is None or int8_weight is None or _rank(found[0]) != 4:
        return None
    shape = static_shape(int8_weight[0])
    if shape is None or len(shape) != 4 or shape[0] % groups:
        return None
    outputs, per_group, kh, kw = shape
    if per_group == 1 and outputs == groups and kh * kw <= _INTEGER_DEPTHWISE:
        return "depthwise", found, int8_weight
    if per_group * kh * kw <= _INTEGER_GROUPED:
        return "grouped", found, int8_weight
    return None


def _quantized_operands(x: torch.Tensor, weight: torch.Tensor):
    """The FX nodes of a convolution's operands being traced (a decomposition's), where
    either is a quantized_decomposed op's result; None otherwise."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

    mode = get_proxy_mode()
    if mode is None:
        return None
    nodes = [get_proxy_slot(t, mode.tracer, None) for t in (x, weight)]
    if None in nodes:
        return None
    x, weight = (n.proxy.node for n in nodes)
    # (the quantized_decomposed ops are registered only where a quantized graph made them)
    if not any(getattr(n.target, "namespace", None) == "quantized_decomposed" for n in (x, weight)):
        return None
    return x, weight


def quantized_convolution(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a convolution being traced reads a dequantized activation or weight: its
    decomposition leaves it whole, for `rewrite_quantized` to find."""
    return _quantized_operands(x, weight) is not None


def integer_grouped_convolution(x: torch.Tensor, weight: torch.Tensor, groups: int) -> bool:
    """Whether a grouped convolution being traced (a decomposition's operands) reads a
    quantized activation and weight that `rewrite_quantized` makes integer arithmetic:
    its decomposition leaves it whole for that rewrite."""
    if groups == 1:
        return False
    nodes = _quantized_operands(x, weight)
    return nodes is not None and grouped_form(*nodes, groups) is not None


def _integer_convolutions(gm: torch.fx.GraphModule, qd) -> int:
    """2-D convolutions of an int8 weight and an activation quantized with constant
    parameters (one group: `quantized_conv2d`) or per call (`dynamic_int8_conv2d`), and
    grouped ones of either (`int8_depthwise_conv2d`, `int8_grouped_conv2d`)."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        found = _conv_args(node)
        if found is None:
            continue
        x, w, bias, stride, padding, dilation, groups = found
        geometry = (bias, list(stride), list(padding), list(dilation))
        if groups != 1:
            form = grouped_form(x, w, groups)
            if form is None:
                continue
            kind, (q_input, scale, zero, dtype), (q_weight, w_scale, w_zero, *_) = form
            quantized_from = _requantized(q_input, x, node)
            if kind == "depthwise" and quantized_from is not None:
                _splice(gm, node, requantized_depthwise_conv2d, (*quantized_from, q_weight, w_scale, w_zero,
                                                                 *geometry))
            elif kind == "depthwise":
                _splice(gm, node, int8_depthwise_conv2d, (q_input, scale, zero, q_weight, w_scale, w_zero, *geometry))
            else:
                _splice(gm, node, int8_grouped_conv2d, (q_input, scale, zero, dtype, q_weight, w_scale, w_zero,
                                                        *geometry, groups))
            rewritten += 1
            continue
        weight = _int8_weight(w)
        if weight is None or _rank(weight[0]) != 4:
            continue
        q_weight, w_scale, w_zero, w_low, w_high, per_channel = weight
        dynamic = _dynamic_input(x)
        if dynamic is not None and _rank(dynamic[0]) == 4:
            _splice(gm, node, dynamic_int8_conv2d, (*dynamic, q_weight, w_scale, w_zero, *geometry))
            rewritten += 1
            continue
        if not is_call(x, qd.dequantize_per_tensor.default) or len(x.args) != 6 or x.kwargs:
            continue
        q_input, scale, zero, low, high, dtype = x.args
        if dtype != torch.int8 or not isinstance(scale, float) or not isinstance(zero, int) or _rank(q_input) != 4:
            continue
        _splice(gm, node, quantized_conv2d, (q_input, scale, zero, low, high, q_weight, w_scale, w_zero, w_low,
                                             w_high, per_channel, *geometry))
        rewritten += 1
    return rewritten


def _retype(node: torch.fx.Node, dtype: torch.dtype) -> None:
    """Give `node`'s recorded value (and its tensor metadata, which the importer reads
    first) the element type `dtype`."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    for key in ("val", "example_value"):
        if isinstance(node.meta.get(key), torch.Tensor):
            with fake_mode_of([node.meta[key]]):
                node.meta[key] = torch.empty_like(node.meta[key], dtype=dtype)
            if "tensor_meta" in node.meta:
                node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta[key])


def _splice(gm: torch.fx.GraphModule, node: torch.fx.Node, fn, args: tuple) -> None:
    """Replace `node` with `fn(*args)` traced to ATen ops on the graph's fake values
    (the nodes among `args` are its tensor inputs)."""
    inputs = [a for a in args if isinstance(a, torch.fx.Node)]

    def call(*tensors):
        supplied = iter(tensors)
        return fn(*(next(supplied) if isinstance(a, torch.fx.Node) else a for a in args))

    result = splice_traced(gm.graph, node, call, inputs, fake_mode_of([value_of(a) for a in inputs]), decompose=False,
                           what=f"the quantized form of {node.target}")
    if isinstance(result, (tuple, list)):  # a tuple result: the node's getitem users take its parts
        for user in list(node.users):
            user.replace_all_uses_with(result[user.args[1]])
            gm.graph.erase_node(user)
        gm.graph.erase_node(node)
        return
    node.replace_all_uses_with(result)
    gm.graph.erase_node(node)


def int8_linear(q_input: torch.Tensor, input_scale, input_zero, input_dtype: torch.dtype, q_weight: torch.Tensor,
                weight_scale, weight_zero) -> torch.Tensor:
    """dequantize(q_input) @ dequantize(q_weight).T for an activation quantized per
    tensor (scale and zero point as tensors, computed per call, or numbers): an int8 x
    int8 -> int32 matmul, the zero points' products subtracted with the operands' row
    sums, the scales applied after."""
    q_input, input_zero = _as_int8(q_input, input_zero, input_dtype)
    depth = q_input.shape[1]
    accumulated = torch._int_mm(q_input, q_weight.permute(1, 0))
    # per-channel weights' scale and zero point are tensors, per-tensor ones numbers
    input_zero = _zero(input_zero, torch.int32)
    weight_zero = _zero(weight_zero, torch.int32, (-1,))
    rows = q_input.to(torch.int32).sum(1, keepdim=True, dtype=torch.int32)
    columns = q_weight.to(torch.int32).sum(1, dtype=torch.int32)
    exact = accumulated - weight_zero * rows - input_zero * columns + depth * input_zero * weight_zero
    return _scaled(exact, input_scale, weight_scale, (-1,))


_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default)


def _reshaped(node) -> torch.fx.Node:
    """The tensor that `node` views, reshapes or expands (through a chain of them)."""
    while any(is_call(node, op) for op in _RESHAPES):
        node = node.args[0]
    return node


def dynamic_int8_linear_as(q_input, input_scale, input_zero, input_dtype, q_weight, weight_scale, weight_zero,
                           shape: list[int]) -> torch.Tensor:
    """`int8_linear` of `q_input` as rows of the weight's depth (the quantization
    is per tensor: any shape holds the same values), its result in the matmul's `shape`."""
    rows = q_input.reshape(-1, q_weight.shape[1])
    return int8_linear(rows, input_scale, input_zero, input_dtype, q_weight, weight_scale,
                       weight_zero).reshape(shape)


def quantized_linear_as(q_input: torch.Tensor, scale: float, zero: int, low: int, high: int,
                        weight_t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """A linear layer of an int8 activation quantized with constant parameters, as the
    matmul of its rows dequantized (the quantization is per tensor: any shape holds the
    same values) and the dequantized weight transposed, which Torch-MLIR makes an
    integer matmul; the result in the matmul's `shape`."""
    rows = torch.ops.quantized_decomposed.dequantize_per_tensor.default(
        q_input.reshape(-1, weight_t.shape[0]), scale, zero, low, high, torch.int8)
    return torch.mm(rows, weight_t).reshape(shape)


def _linears(gm: torch.fx.GraphModule, qd) -> int:
    """Linear layers of a quantized activation and a 2-D int8 weight:
    mm(dequantize(x), permute(dequantize(w))), with x reshaped to rows after its
    dequantize (a linear of more than two dimensions), and the bmm form of a linear of
    a non-contiguous input (x expanded to its own shape, the transposed weight expanded
    over the batch). The quantization is per tensor, so x's rows are its values in any
    shape. An activation quantized per call becomes `int8_linear`, and so does one
    row of an activation with constant parameters; other rows with constant
    parameters are dequantized after the reshape to rows, where Torch-MLIR fuses the
    matmul (a reshape between them left it float32)."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if not (is_call(node, aten.mm.default) or is_call(node, aten.bmm.default)):
            continue
        x, transposed = node.args
        source = _reshaped(x)
        found = _quantized_input(source)
        transposed = _reshaped(transposed)
        if found is None or not is_call(transposed, aten.permute.default) or list(transposed.args[1]) != [1, 0]:
            continue
        weight = _int8_weight(transposed.args[0])
        if weight is None or _rank(weight[0]) != 2:
            continue
        q_input, scale, zero, dtype = found
        dynamic = isinstance(scale, torch.fx.Node)
        if source is x and _rank(x) == 2 and is_call(node, aten.mm.default):
            if dynamic or (static_shape(x) or [0])[0] == 1:  # sizes may be symbolic
                _splice(gm, node, int8_linear, (*found, *weight[:3]))
                rewritten += 1
            continue  # constant parameters: Torch-MLIR's integer matmul as it stands
        x_shape, rows_shape, shape = static_shape(source), static_shape(x), static_shape(node)
        if None in (x_shape, rows_shape, shape) or math.prod(x_shape) != math.prod(rows_shape):
            continue  # symbolic sizes, or an expand that broadcasts x
        if dynamic:
            _splice(gm, node, dynamic_int8_linear_as, (*found, *weight[:3], shape))
        elif dtype == torch.int8:
            _splice(gm, node, quantized_linear_as, (q_input, scale, zero, -128, 127, transposed, shape))
        else:
            continue
        rewritten += 1
    return rewritten


def choose_qparams(x, quant_min, quant_max, eps, dtype):
    """`quantized_decomposed.choose_qparams.tensor` in torch ops, with eager's arithmetic."""
    low, high = aten.aminmax.default(x)
    low = torch.minimum(low, torch.zeros_like(low))
    high = torch.maximum(high, torch.zeros_like(high))
    scale = (high - low) / float(quant_max - quant_min)
    scale = torch.maximum(scale, torch.full_like(scale, eps))
    zero_point = quant_min - torch.round(low / scale).to(torch.int32)
    zero_point = torch.clamp(zero_point, quant_min, quant_max)
    return scale.reshape(1).to(torch.float64), zero_point.reshape(1).to(torch.int64)


def quantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype):
    """`quantize_per_tensor.tensor`: the inverse scale rounded to the input's dtype, as eager."""
    inverse = (1.0 / scale).to(x.dtype)
    return torch.clamp(torch.round(x * inverse) + zero_point.to(x.dtype), quant_min, quant_max).to(dtype)


def quantize_per_tensor_default(x, scale: float, zero_point: int, quant_min: int, quant_max: int, dtype):
    """`quantize_per_tensor.default`: times the inverse scale, as eager computes it
    (Torch-MLIR's lowering divides by the scale: a division per element)."""
    return torch.clamp(torch.round(x * (1.0 / scale)) + zero_point, quant_min, quant_max).to(dtype)


def dequantize_per_tensor(q, scale, zero_point, quant_min, quant_max, dtype, *, out_dtype=None):
    out_dtype = out_dtype or torch.float32
    return (q.to(out_dtype) - zero_point.to(out_dtype)) * scale.to(out_dtype)


def _dynamic_formulas(gm: torch.fx.GraphModule, qd) -> int:
    """The per-call quantization ops left after `_linears`, as formulas: Torch-MLIR
    imports none of them, and their PyTorch kernels read the tensors with `.item()`."""
    formulas = {qd.choose_qparams.tensor: choose_qparams, qd.quantize_per_tensor.tensor: quantize_per_tensor,
                qd.dequantize_per_tensor.tensor: dequantize_per_tensor,
                qd.quantize_per_tensor.default: quantize_per_tensor_default}
    rewritten = 0
    for node in list(gm.graph.nodes):
        if node.target is qd.quantize_per_tensor.default and (
                node.kwargs or getattr(value_of(node.args[0]), "dtype", None) != torch.float32):
            continue
        if node.op == "call_function" and node.target in formulas and node.users:
            fn = formulas[node.target]
            kwargs = dict(node.kwargs)
            _splice(gm, node, (lambda *a, fn=fn, kwargs=kwargs: fn(*a, **kwargs)), tuple(node.args))
            rewritten += 1
    return rewritten


# Views of a weight's dequantized value that a rewrite leaves unread.
_VIEWS = frozenset({aten.permute.default, aten.t.default, aten.view.default, aten.reshape.default})


def _erase_unused(gm: torch.fx.GraphModule) -> None:
    """The quantize/dequantize ops (and views of them) that rewrites left unread."""
    for node in reversed(list(gm.graph.nodes)):
        if node.op == "call_function" and not node.users and (
                getattr(node.target, "namespace", None) == "quantized_decomposed" or node.target is operator.getitem
                or node.target in _VIEWS):
            gm.graph.erase_node(node)


def rewrite_quantized(gm: torch.fx.GraphModule) -> int:
    """Rewrite a functional ATen graph's quantized patterns (above); the number of rewrites."""
    if not any(n.op == "call_function" and getattr(n.target, "namespace", None) == "quantized_decomposed"
               for n in gm.graph.nodes):
        return 0
    qd = _ops()
    if qd is None:
        return 0
    before = _summary_entries(gm)
    rewritten = _signed_activations(gm, qd) + _integer_convolutions(gm, qd) + _linears(gm, qd)
    if rewritten:  # the quantize ops whose dequantize the rewrites replaced
        _erase_unused(gm)
    # as the rewrites left them (an activation's uint8 pair now int8), before the
    # formulas replace the quantize ops
    before.update(_summary_entries(gm))
    rewritten += _dynamic_formulas(gm, qd)
    if rewritten:
        _erase_unused(gm)
        sink_channel_permutes(gm)
        gm.recompile()
        log.debug("rewrote %d quantized patterns", rewritten)
        # The rewritten graph's own entries, and those its rewrites replaced with plain
        # torch ops: per-call activation quantization, and weights read as int8 directly.
        after = _summary_entries(gm)
        stored = {entry["tensor"] for entry in after.values()}
        gm.meta[_SUMMARY] = [*after.values(), *(entry for node, entry in before.items() if node not in after and (
            entry["tensor"] == "activation" or entry["tensor"] not in stored))]
    return rewritten


STATE_NAME = "tori_state_name"  # node.meta key: the parameter or buffer a get_attr node reads (tori.export)


def _state_name(value) -> str | None:
    """The state a tensor argument reads, through views and reshapes."""
    while isinstance(value, torch.fx.Node):
        if STATE_NAME in value.meta:
            return value.meta[STATE_NAME]
        if value.op != "call_function" or value.target not in (aten.view.default, aten.reshape.default,
                                                              aten._unsafe_view.default):
            return None
        value = value.args[0]
    return None


def _describe(value):
    if isinstance(value, torch.fx.Node):
        return _state_name(value) or "computed"
    return value


_SUMMARY = "tori_quantization"  # GraphModule.meta key: the summary of a rewritten graph


def quantization_summary(gm: torch.fx.GraphModule) -> list[dict]:
    """The graph's quantization as run: each quantize op of an activation and each
    dequantize of a stored (int8) tensor, with its dtype, range, scale and zero point
    (numbers, the names of the parameters holding them, or "computed" for scales
    computed per call). After `rewrite_quantized`, also the quantization that its
    rewrites turned into plain torch ops."""
    if _SUMMARY in gm.meta:
        return gm.meta[_SUMMARY]
    return list(_summary_entries(gm).values())


def _summary_entries(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, dict]:
    summary = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "namespace", None) != "quantized_decomposed":
            continue
        op = node.target._overloadpacket.__name__
        stored = _state_name(node.args[0]) if node.args else None
        if not (op.startswith("quantize") or (op.startswith("dequantize") and stored)):
            continue
        args = list(node.args)
        per_channel = op.endswith("per_channel")
        low, high, dtype = args[4:7] if per_channel else args[3:6]
        entry = {"op": op, "tensor": stored or "activation", "dtype": dtype_name(dtype), "range": [low, high],
                 "scale": _describe(args[1]), "zero_point": _describe(args[2])}
        if per_channel:
            entry["axis"] = args[3]
        summary[node] = entry
    return summary
