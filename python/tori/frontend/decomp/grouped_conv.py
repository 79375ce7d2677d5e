"""Convolutions IREE lowers badly. Grouped and depthwise 2-D convolutions as the taps
of their windows, and 1-D ones whose strided windows leave the input's last elements
out cut to what the windows read (their lowering failed to verify).

Grouped 2-D convolutions as the taps of their windows: IREE's CPU lowering of
`linalg.conv_2d_ngchw_gfchw` and `depthwise_conv_2d_nchw_chw` ran 20-50x behind
eager (a RegNet grouped 3x3 at 192 channels 19.9 ms, eager 0.37; a ConvNeXt
depthwise 7x7 2.28 ms, eager 0.10; docs/performance.md).

A float32 depthwise convolution (one input channel per group) stays one op:
tori-depthwise-nhwc gives it IREE's channels-last depthwise kernel, faster than its
taps (0.11 ms for a 7x7 over 384 channels at 14x14, eager 0.27) at a fraction of
their compile time. Each of the kernel's kh*kw taps is a strided view of the padded
input. A 16-bit depthwise convolution multiplies each tap by its weight column and
sums, which IREE fuses into one elementwise dispatch (0.61 ms for the 7x7); a
grouped one stacks the taps into im2col columns per group and multiplies them by the
group's weights in one batched matmul (1.1 ms for the 3x3). A grouped convolution of
a quantized activation and an int8 weight stays whole: frontend/quantized.py makes it
integer arithmetic.
"""

from __future__ import annotations

import torch

from tori.frontend.decomp.pytorch import window_extent
from tori.frontend.decompositions import register_decomposition
from tori.frontend.quantized import integer_grouped_convolution

aten = torch.ops.aten


def _taps(x: torch.Tensor, kernel, stride, padding, dilation):
    """The kh*kw strided views of the zero-padded input that a window's positions read,
    row-major over the kernel, each (N, C, OH, OW)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    height, width = x.shape[-2:]
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    padded = aten.constant_pad_nd.default(x, [pw, pw, ph, ph], 0.0) if ph or pw else x
    return [padded[:, :, i * dh: i * dh + sh * (out_h - 1) + 1: sh, j * dw: j * dw + sw * (out_w - 1) + 1: sw]
            for i in range(kh) for j in range(kw)], out_h, out_w


@register_decomposition(aten.convolution.default)
def convolution(op, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Ragged 1-D convolutions cropped (below), grouped 2-D ones as their taps."""
    cropped = _ragged_conv1d(x, weight, stride, padding, dilation, transposed)
    if cropped is not None:
        return aten.convolution.default(cropped, weight, bias, stride, [0], dilation, False, output_padding, groups)
    return grouped_conv2d(op, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def _ragged_conv1d(x, weight, stride, padding, dilation, transposed):
    """The zero-padded input cut to the length the windows read, for a 1-D convolution
    whose strided windows leave the last elements out (length 4, kernel 3, stride 2):
    Torch-MLIR's lowering of it to linalg fails to verify ("inferred input/output
    operand #1 has shape's dimension #1 to be 4, but found 3"; found by the fuzzer).
    None for any other convolution."""
    if transposed or x.dim() != 3 or weight.dim() != 3 or len(stride) != 1 or len(padding) != 1:
        return None
    if not all(isinstance(n, int) for n in (*x.shape, *weight.shape)) or x.numel() == 0:
        return None
    (step,), (pad,), (spread,) = stride, padding, dilation
    padded_length = x.shape[-1] + 2 * pad
    if padded_length < spread * (weight.shape[-1] - 1) + 1:
        return None
    used = window_extent(x.shape[-1], weight.shape[-1], step, pad, spread, ceil_mode=False)
    if used == padded_length:
        return None
    padded = aten.constant_pad_nd.default(x, [pad, pad], 0.0) if pad else x
    return aten.slice.Tensor(padded, 2, 0, used)


def grouped_conv2d(op, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    if groups == 1 or transposed or x.dim() != 4 or weight.dim() != 4 or not x.dtype.is_floating_point:
        return NotImplemented
    if not all(isinstance(n, int) for n in (*x.shape, *weight.shape)) or x.numel() == 0:
        return NotImplemented
    if len(stride) != 2 or len(padding) != 2 or len(dilation) != 2:
        return NotImplemented
    if integer_grouped_convolution(x, weight, groups):
        return NotImplemented  # int8 operands: integer arithmetic (frontend/quantized.py)
    out_channels, per_group, kh, kw = weight.shape
    if per_group == 1 and out_channels == groups and x.dtype == torch.float32:
        return NotImplemented  # IREE's NHWC depthwise kernel (passes/depthwise_nhwc.py)
    taps, out_h, out_w = _taps(x, (kh, kw), stride, padding, dilation)
    batch = x.shape[0]
    if per_group == 1 and out_channels == groups:  # depthwise, 16-bit floats (computed in float32)
        columns = weight.reshape(out_channels, kh * kw)
        out = None
        for index, tap in enumerate(taps):
            term = tap * columns[:, index].reshape(1, out_channels, 1, 1)
            out = term if out is None else out + term
    else:
        # columns (N, G, c*kh*kw, OH*OW) in the weight's (c, kh, kw) order
        columns = torch.stack(taps, 2).reshape(batch, groups, per_group * kh * kw, out_h * out_w)
        out = torch.matmul(weight.reshape(groups, out_channels // groups, per_group * kh * kw), columns)
        out = out.reshape(batch, out_channels, out_h, out_w)
    return out if bias is None else out + bias.reshape(1, out_channels, 1, 1)
