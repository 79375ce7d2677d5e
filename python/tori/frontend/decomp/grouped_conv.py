"""Convolutions IREE lowers badly. 2-D convolutions over single pixels or image patches
as matmuls, and over few output pixels as a matmul of their windows' columns; grouped
ones as one convolution per group, or as the taps of their windows; and 1-D ones whose
strided windows leave the input's last elements out cut to what the windows read
(their lowering failed to verify).

Grouped 2-D convolutions as the taps of their windows: IREE's CPU lowering of
`linalg.conv_2d_ngchw_gfchw` and `depthwise_conv_2d_nchw_chw` ran 20-50x behind
eager (a RegNet grouped 3x3 at 192 channels 19.9 ms, eager 0.37; a ConvNeXt
depthwise 7x7 2.28 ms, eager 0.10; docs/performance.md).

A float32 depthwise convolution (one input channel per group) stays one op:
tori-depthwise-nhwc gives it IREE's channels-last depthwise kernel, faster than its
taps (0.11 ms for a 7x7 over 384 channels at 14x14, eager 0.27) at a fraction of
their compile time. Each of the kernel's kh*kw taps is a strided view of the padded
input. A 16-bit depthwise convolution multiplies each tap by its weight column and
sums, which IREE fuses into one elementwise dispatch (0.61 ms for the 7x7). A float32
grouped convolution with several channels per group runs as one convolution per group
where IREE's direct channels-last kernels run them and it has the work to pay for
their executables (`MAX_SPLIT_GROUPS`, `SPLIT_MIN_GFLOP`); any other stacks the taps
into im2col columns per group and multiplies them by the group's weights in one
batched matmul (1.1 ms for the 3x3; its columns gathered channels first, as
`gathered_windows` gathers those of few pixels channels last, ran RegNetY-1.6GF at one
image in 56-61 ms against 30 on IREE's task driver: docs/performance.md). A grouped
convolution of a quantized activation and an int8 weight stays whole:
frontend/quantized.py makes it integer arithmetic.
"""

from __future__ import annotations

import weakref

import torch

from tori.frontend.decomp.pytorch import window_extent
from tori.frontend.decompositions import as_is, register_decomposition
from tori.frontend.quantized import gathered_windows, integer_grouped_convolution, quantized_convolution
from tori.targets.codegen import conv_flop

aten = torch.ops.aten

# A float32 grouped convolution with several channels per group runs as one 2-D
# convolution per group, each channels last in IREE: 8 images with their 1x1
# convolution, BatchNorm and ReLU, 48 channels in 2 groups at 56x56 7.8 ms against the
# taps' 16.7 (eager 13.4), 120 in 5 at 28x28 5.1 against 12.9, 336 in 14 at 14x14 5.6
# against 10.0, 888 in 37 at 7x7 8.0 against 12.0. Each group's convolution reads its
# own channels and so is an executable of its own: RegNetY-1.6GF's iree-compile took
# 36.7 s against the taps' 21.7. Beyond this many groups the taps' one batched matmul
# keeps the compile bounded.
MAX_SPLIT_GROUPS = 64
# ...and only with this much work: RegNetY-1.6GF at one image splits its first stage
# alone (0.065 GFLOP per convolution; the later ones 0.019-0.041), 32.5 and 38.5 ms
# against 32.7 and 32.5 with every stage split (eager 40-59 in the same processes), its
# first call 27.2 and 28.3 s against 45.0 and 39.6. At 8 images every stage splits.
SPLIT_MIN_GFLOP = 0.05
# A float32 convolution with one group over at most this many output pixels (over the
# batch), in a graph whose convolutions get the convolution rule
# (`_convolution_rule_applies`), runs as a matmul of its windows' columns, channels last,
# rather than on IREE's direct kernel, whose tiles for few pixels keep most of the CPU
# idle: ResNet-18's 3x3 convolutions at one image (Xeon with AVX-512, 2026-12-04), 512 channels at 7x7
# 4.3 ms each on the direct kernel (53 GFLOP/s, 16% of torch.mm's 338) against 2.4 as
# columns (95); 256 at 14x14 2.4-2.7 ms (87-95 GFLOP/s) against 1.3-1.4 (161-175).
# ResNet-18 40.0 -> 26.8 ms at one image (eager 21.5-23.4), 219.5 -> 155.4 at 8 (eager
# 150); at most 196, 512, 2048 and 8192 pixels: 27.0, -, 26.8 and 33.5 ms at one image,
# 219.5, 161.6, 155.4 and 176.6 at 8. ResNet-50 71.0 -> 57.3 and 407 -> 348 ms (eager 52
# and 377).
SMALL_IMAGE_ROWS = 2048


def _direct_convolutions() -> bool:
    """Whether the graph being traced is compiled for IREE's direct channels-last
    convolutions (a CPU with AVX-512): under img2col, one convolution per group was
    slower than the taps (one RegNetY block, 19.0-21.7 ms against 12.5)."""
    from tori.frontend.decompositions import traced_options
    from tori.targets.codegen import direct_convolutions

    options = traced_options()
    return options is not None and direct_convolutions(options)


def _output_size(x: torch.Tensor, kernel, stride, padding, dilation) -> tuple[int, int]:
    return tuple((size + 2 * pad - dil * (k - 1) - 1) // step + 1
                 for size, k, step, pad, dil in zip(x.shape[-2:], kernel, stride, padding, dilation))


def _split_per_group(x: torch.Tensor, weight: torch.Tensor, stride, padding, dilation, groups: int) -> bool:
    """Whether a float32 grouped convolution with several channels per group runs as
    one convolution per group (MAX_SPLIT_GROUPS, SPLIT_MIN_GFLOP)."""
    out_channels, per_group, kh, kw = weight.shape
    if x.dtype != torch.float32 or per_group == 1 or groups > MAX_SPLIT_GROUPS:
        return False
    out = (x.shape[0], out_channels, *_output_size(x, (kh, kw), stride, padding, dilation))
    return conv_flop(out, weight.shape) / 1e9 >= SPLIT_MIN_GFLOP and _direct_convolutions()


def _zero_padded(x: torch.Tensor, padding, channels_last: bool = False) -> torch.Tensor:
    """An NCHW input (or its NHWC permutation) with `padding` zeros around each image."""
    ph, pw = padding
    if not (ph or pw):
        return x
    return aten.constant_pad_nd.default(x, [0, 0, pw, pw, ph, ph] if channels_last else [pw, pw, ph, ph], 0.0)


def _taps(x: torch.Tensor, kernel, stride, padding, dilation):
    """The kh*kw strided views of the zero-padded input that a window's positions read,
    row-major over the kernel, each (N, C, OH, OW)."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    out_h, out_w = _output_size(x, kernel, stride, padding, dilation)
    padded = _zero_padded(x, padding)
    return [padded[:, :, i * dh: i * dh + sh * (out_h - 1) + 1: sh, j * dw: j * dw + sw * (out_w - 1) + 1: sw]
            for i in range(kh) for j in range(kw)], out_h, out_w


@register_decomposition(aten.convolution.default)
def convolution(op, x, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """Ragged 1-D convolutions cropped, pixel and patch windows as matmuls, grouped 2-D
    convolutions per group or as their taps (below)."""
    cropped = _ragged_conv1d(x, weight, stride, padding, dilation, transposed)
    if cropped is not None:
        return aten.convolution.default(cropped, weight, bias, stride, [0], dilation, False, output_padding, groups)
    windows = _windows_as_matmul(x, weight, bias, stride, padding, dilation, transposed, groups)
    if windows is not None:
        return windows
    columns = _small_image_as_matmul(x, weight, bias, stride, padding, dilation, transposed, groups)
    if columns is not None:
        return columns
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


def _windows_as_matmul(x, weight, bias, stride, padding, dilation, transposed, groups):
    """A float 2-D convolution with one group and no padding whose windows are single
    pixels (a 1x1 kernel, any stride) or tile the image (the stride is the kernel: a
    vision transformer's patches) as a matmul of its windows, channels last, by the
    weight; returned NCHW. None for any other convolution.

    IREE data-tiles a 2-D matmul. A 1x1 convolution it lowered itself stayed a batched
    contraction at 72 GFLOP/s (RegNetY's 336 channels at 14x14, 8 images), a strided one
    a reduction at 6% of the GEMM rate (ResNet-50's shortcuts: 27.8 ms at batch 1), and
    its direct kernel on patches was slow (DeiT-small's 16x16 patches, 8 images).
    The permutes cancel against IREE's channels-last layout of the convolutions around."""
    if transposed or groups != 1 or x.dim() != 4 or weight.dim() != 4 or len(stride) != 2:
        return None
    if any(padding) or any(d != 1 for d in dilation) or not x.dtype.is_floating_point or weight.dtype != x.dtype:
        return None
    if not all(isinstance(n, int) for n in (*x.shape, *weight.shape)) or x.numel() == 0:
        return None
    if quantized_convolution(x, weight):
        return None  # int8 operands: integer arithmetic (frontend/quantized.py)
    out_channels, channels, kh, kw = weight.shape
    pixels = x.permute(0, 2, 3, 1)
    if (kh, kw) == (1, 1):
        windows = pixels if tuple(stride) == (1, 1) else pixels[:, ::stride[0], ::stride[1], :]
    elif tuple(stride) == (kh, kw) and x.shape[2] >= kh and x.shape[3] >= kw:
        batch, height, width = x.shape[0], x.shape[2] // kh, x.shape[3] // kw
        tiles = pixels[:, :height * kh, :width * kw, :].reshape(batch, height, kh, width, kw, channels)
        windows = tiles.permute(0, 1, 3, 2, 4, 5).reshape(batch, height, width, kh * kw * channels)
    else:
        return None
    batch, height, width, size = windows.shape
    # (kh, kw, C), as the windows; a 1x1 kernel's weight is that already
    columns = weight.reshape(out_channels, size) if (kh, kw) == (1, 1) else \
        weight.permute(0, 2, 3, 1).reshape(out_channels, size)
    out = torch.mm(windows.reshape(batch * height * width, size), columns.t())
    if bias is not None:
        out = out + bias
    return out.reshape(batch, height, width, out_channels).permute(0, 3, 1, 2)


_CONVOLUTION_CALLS = {torch.conv2d, torch.nn.functional.conv2d, torch.ops.aten.conv2d.default,
                      torch.ops.aten.convolution.default}
_GRAPH_CONVOLUTION_GFLOP: "weakref.WeakKeyDictionary[torch.fx.GraphModule, float]" = weakref.WeakKeyDictionary()


def _captured_convolution_gflop(gm: torch.fx.GraphModule) -> float:
    """The 2-D convolutions' work per call in Dynamo's graph `gm` (before any is
    decomposed), in GFLOP, from the example values of their results and weights."""
    if gm not in _GRAPH_CONVOLUTION_GFLOP:
        total = 0.0
        for node in gm.graph.nodes:
            weight = None
            if node.op == "call_function" and node.target in _CONVOLUTION_CALLS and len(node.args) > 1:
                weight = node.args[1].meta.get("example_value") if isinstance(node.args[1], torch.fx.Node) else None
            elif node.op == "call_module" and isinstance(module := gm.get_submodule(node.target), torch.nn.Conv2d):
                weight = module.weight
            out = node.meta.get("example_value")
            if isinstance(weight, torch.Tensor) and weight.dim() == 4 and isinstance(out, torch.Tensor) \
                    and all(isinstance(d, int) for d in (*out.shape, *weight.shape)):
                total += conv_flop(tuple(out.shape), tuple(weight.shape)) / 1e9
        _GRAPH_CONVOLUTION_GFLOP[gm] = total
    return _GRAPH_CONVOLUTION_GFLOP[gm]


def _convolution_rule_applies() -> bool:
    """Whether the graph being traced gets the convolution rule (IREE's direct
    channels-last kernels): compiled for them, with its convolutions' work (Dynamo's
    graph, counted before any convolution becomes a matmul) above the rule's floor.
    Below it the convolutions keep IREE's defaults: the benchmarks' cnn_bn (0.045 GFLOP),
    two of its convolutions as columns and its poolings channels last, ran at 0.72 and
    0.80 of eager's time, at 0.56 and 0.62 after this gate and tori-pooling-nhwc's
    (passes/lower_dialect.py, where the pooling's share alone is measured; the columns'
    share was not separated)."""
    from tori.frontend.decompositions import traced_graph, traced_options
    from tori.targets.codegen import convolution_rule_applies

    options, gm = traced_options(), traced_graph()
    if options is None or gm is None:
        return _direct_convolutions()
    return convolution_rule_applies(options, _captured_convolution_gflop(gm))


def _small_image_as_matmul(x, weight, bias, stride, padding, dilation, transposed, groups):
    """A float32 2-D convolution with one group over few output pixels (at most
    SMALL_IMAGE_ROWS over the batch) where IREE's direct channels-last kernel would run
    it (`_convolution_rule_applies`): its windows' columns, channels last, times the
    weight, one data-tiled matmul. None for any other convolution."""
    if transposed or groups != 1 or x.dim() != 4 or weight.dim() != 4 or len(stride) != 2:
        return None
    if x.dtype != torch.float32 or weight.dtype != x.dtype or quantized_convolution(x, weight):
        return None
    if not all(isinstance(n, int) for n in (*x.shape, *weight.shape)) or x.numel() == 0:
        return None
    out_channels, channels, kh, kw = weight.shape
    out_h, out_w = _output_size(x, (kh, kw), stride, padding, dilation)
    if out_h < 1 or out_w < 1 or x.shape[0] * out_h * out_w > SMALL_IMAGE_ROWS or not _convolution_rule_applies():
        return None
    # The windows of the channels-last input, not the channels-first ones permuted after:
    # those ran ResNet-18 in 33.5 ms at one image against 26.8, 171.0 at 8 against 155.4.
    padded = _zero_padded(x.permute(0, 2, 3, 1), padding, channels_last=True)
    windows = gathered_windows(padded, (kh, kw), stride, dilation).reshape(-1, kh * kw * channels)
    columns = weight.permute(0, 2, 3, 1).reshape(out_channels, kh * kw * channels)
    out = torch.mm(windows, columns.t())
    if bias is not None:
        out = out + bias
    return out.reshape(x.shape[0], out_h, out_w, out_channels).permute(0, 3, 1, 2)


def _group_convolution(x, weight, stride, padding, dilation, output_padding):
    """One group's convolution: a matmul of its pixels where its windows are pixels,
    else the convolution itself (never columns of small images)."""
    windows = _windows_as_matmul(x, weight, None, stride, padding, dilation, False, 1)
    if windows is not None:
        return windows
    return as_is(aten.convolution.default, x, weight, None, stride, padding, dilation, False, output_padding, 1)


def _group_weights(weight: torch.Tensor, groups: int) -> list[torch.Tensor]:
    """Each group's weight as a copy of its own. A resident weight's copies are made by
    the weight prologue (frontend/weight_prologue.py) when the weights load, each a
    global of its own: IREE's initializer then lays every group's filter out for its
    channels-last kernel with one executable, where the groups read at their offsets in
    one weight were an executable each, their offsets constants (RegNetY-1.6GF at 8
    images: 59 of its 357; iree-compile 17.2, 17.5 s against 16.0, 15.9 in one process,
    188.2, 188.4 ms a call against 189.8, 187.9)."""
    size = weight.shape[0] // groups
    return [weight[g * size:(g + 1) * size].clone() for g in range(groups)]


def _per_group(x, weight, bias, stride, padding, dilation, output_padding, groups):
    """One convolution per group, its input the group's channels as one contiguous slab
    of the input laid out (G, N, H, W, c), its result a slab of one (G, N, OH, OW, co):
    one transpose of the input and one of the result around all the groups. Each group's
    channels sliced from the NCHW input and its results concatenated were a transpose in
    and out of each group's convolution (IREE's channels-last form): 127 transposes and
    61 copies among RegNetY-1.6GF's 259 executables at 8 images; as slabs, 203.
    Compiled in one process, calls alternating, channels sliced against slabs:
    RegNetY-1.6GF at 8 images 14.90, 13.94 s against 12.19, 12.23 of compile, 184.7, 185.3
    ms a call against 188.3, 184.7; at one image (its first stage split) 8.16, 7.81 s
    against 7.77, 8.02 and 30.7, 30.8 ms against 30.7, 30.6."""
    batch, channels, height, width = x.shape
    slabs = x.reshape(batch, groups, channels // groups, height, width).permute(1, 0, 3, 4, 2).contiguous()
    parts = [_group_convolution(slabs[g].permute(0, 3, 1, 2), part_weight, stride, padding, dilation,
                                output_padding).permute(0, 2, 3, 1)
             for g, part_weight in enumerate(_group_weights(weight, groups))]
    stacked = torch.stack(parts)  # (G, N, OH, OW, co)
    out = stacked.permute(1, 0, 4, 2, 3).reshape(batch, weight.shape[0], *stacked.shape[2:4])
    return out if bias is None else out + bias.reshape(1, weight.shape[0], 1, 1)


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
    if _split_per_group(x, weight, stride, padding, dilation, groups):
        # One convolution per group, which IREE lowers channels last like any other (on
        # its direct kernel, not as columns: RegNetY-1.6GF at 8 images 190 ms against 260,
        # its iree-compile 47.6 s against 25.3).
        return _per_group(x, weight, bias, stride, padding, dilation, output_padding, groups)
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
