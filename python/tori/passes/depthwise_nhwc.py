"""tori-depthwise-nhwc: a depthwise 2-D convolution reaches IREE in channels-last form,
a `linalg.generic` over [N, OH, OW, C] x [KH, KW] between two transposes.

IREE lowers `torch.aten.convolution` with one input channel per group in NCHW to a
generic whose innermost loop runs along the image: a 7x7 over 384 channels at 14x14
took 2.08 ms that way, 0.099 ms in this form with its transposes, eager 0.27 ms
(docs/performance.md). It is a generic rather than IREE's named
`depthwise_conv_2d_nhwc_hwc` because the img2col preprocessing that tori's
convolution rule asks for turns the named op into a batched matvec over a
materialized im2col buffer (5.96 ms). IREE hoists the weight's transpose into the
initializer where the weight is a resident global, and cancels the activation's
transposes against those of its channels-last neighbours.

Rewrites: `torch.aten.convolution` of a static [N, C, H, W] float32 input and a
[C, 1, KH, KW] weight with groups = C, not transposed, constant strides, padding
and dilations (a bias of [C] or none), into a call of a private function of builtin
tensors (one per distinct form) that transposes the input to NHWC, pads it, runs
the channels-last convolution, adds the bias and transposes back; `torch_c` casts around the call.
The compile runs this pass before IREE whatever the pipeline (`lower_for_iree`).

A convolution of one input channel (C = 1, one group) into M output channels is the
same op with a channel multiplier M; its function sums the kernel's taps instead
(`_single_channel_function`): IREE does not vectorize a windowed generic whose
innermost loop is over the multiplier.

Never changes: grouped convolutions with more than one channel per group, channel
multipliers of more than one input channel (frontend/decomp/grouped_conv.py makes them
taps), transposed, dynamic-shape or non-float32 convolutions, and every other op.

Example:
    %4 = torch.aten.convolution %x, %w, %none, [1,1], [3,3], [1,1], %false, [0,0], %int384
           : !torch.vtensor<[1,384,14,14],f32>, !torch.vtensor<[384,1,7,7],f32>, ... -> !torch.vtensor<[1,384,14,14],f32>
becomes
    %0 = "torch_c.to_builtin_tensor"(%x) : (...) -> tensor<1x384x14x14xf32>
    %1 = "torch_c.to_builtin_tensor"(%w) : (...) -> tensor<384x1x7x7xf32>
    %2 = func.call @tori_depthwise_1x384x14x14_7x7_s1x1_p3x3_d1x1_f32(%0, %1) : ... -> tensor<1x384x14x14xf32>
    %4 = "torch_c.from_builtin_tensor"(%2) : (tensor<1x384x14x14xf32>) -> !torch.vtensor<[1,384,14,14],f32>
    func.func private @tori_depthwise_1x384x14x14_7x7_s1x1_p3x3_d1x1_f32(...) {
      (transpose to NHWC, pad, the convolution as a linalg.generic, transpose back)
    }
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.builtin_calls import (builtin_tensor, call_private_function, f32_shape, int_pair, is_none,
                                      ops_named, torch_constant)
from tori.passes.registry import register_pass

PASS_NAME = "tori-depthwise-nhwc"
# The most taps (kernel rows times columns) of a one-channel convolution summed in one
# generic, each tap an operand of it: a 7x7 stem's 49.
MAX_TAPS = 49

@dataclass(frozen=True)
class WindowForm:
    """The shapes of a 2-D op over windows of an NCHW input (a convolution, a pooling):
    a private function's name and body depend only on them."""

    input: tuple[int, int, int, int]   # N, C, H, W
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    output: tuple[int, int, int, int]

    def signature(self) -> str:
        """The shapes as a function name's part: `1x384x14x14_7x7_s1x1_p3x3_d1x1`."""
        def dims(values) -> str:
            return "x".join(map(str, values))

        return (f"{dims(self.input)}_{dims(self.kernel)}_s{dims(self.stride)}"
                f"_p{dims(self.padding)}_d{dims(self.dilation)}")


@dataclass(frozen=True)
class Depthwise(WindowForm):
    """One form of depthwise convolution: `multiplier` output channels per input channel."""

    bias: bool
    multiplier: int = 1

    @property
    def name(self) -> str:
        multiplier = f"_m{self.multiplier}" if self.multiplier > 1 else ""
        return f"tori_depthwise_{self.signature()}{multiplier}{'_bias' if self.bias else ''}_f32"

    def _input_map(self) -> str:
        (sh, sw), (dh, dw) = self.stride, self.dilation
        return f"affine_map<(n, h, w, c, kh, kw) -> (n, h * {sh} + kh * {dh}, w * {sw} + kw * {dw}, c)>"

    def function(self) -> str:
        """The private function's MLIR text."""
        if self.multiplier > 1:
            return self._single_channel_function()
        n, c, h, w = self.input
        kh, kw = self.kernel
        ph, pw = self.padding
        _, _, oh, ow = self.output

        def t(*dims: int) -> str:
            return f"tensor<{'x'.join(map(str, dims))}xf32>"

        bias_arg = f", %b: {t(c)}" if self.bias else ""
        lines = [
            f"func.func private @{self.name}(%x: {t(n, c, h, w)}, %w: {t(c, 1, kh, kw)}{bias_arg}) -> {t(n, c, oh, ow)} {{",
            "  %zero = arith.constant 0.0 : f32",
            f"  %xt0 = tensor.empty() : {t(n, h, w, c)}",
            f"  %xt = linalg.transpose ins(%x : {t(n, c, h, w)}) outs(%xt0 : {t(n, h, w, c)}) permutation = [0, 2, 3, 1]",
        ]
        padded = (n, h + 2 * ph, w + 2 * pw, c)
        source = "%xt"
        if ph or pw:
            source = "%xp"
            lines += [
                f"  %xp = tensor.pad %xt low[0, {ph}, {pw}, 0] high[0, {ph}, {pw}, 0] {{",
                "  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):",
                "    tensor.yield %zero : f32",
                f"  }} : {t(n, h, w, c)} to {t(*padded)}",
            ]
        lines += [
            f"  %wc = tensor.collapse_shape %w [[0, 1], [2], [3]] : {t(c, 1, kh, kw)} into {t(c, kh, kw)}",
            f"  %wt0 = tensor.empty() : {t(kh, kw, c)}",
            f"  %wt = linalg.transpose ins(%wc : {t(c, kh, kw)}) outs(%wt0 : {t(kh, kw, c)}) permutation = [1, 2, 0]",
            f"  %o0 = tensor.empty() : {t(n, oh, ow, c)}",
            f"  %of = linalg.fill ins(%zero : f32) outs(%o0 : {t(n, oh, ow, c)}) -> {t(n, oh, ow, c)}",
            f"  %o = linalg.generic {{indexing_maps = [{self._input_map()}, "
            "affine_map<(n, h, w, c, kh, kw) -> (kh, kw, c)>, affine_map<(n, h, w, c, kh, kw) -> (n, h, w, c)>], "
            "iterator_types = [\"parallel\", \"parallel\", \"parallel\", \"parallel\", \"reduction\", \"reduction\"]} "
            f"ins({source}, %wt : {t(*padded)}, {t(kh, kw, c)}) outs(%of : {t(n, oh, ow, c)}) {{",
            "  ^bb0(%in: f32, %k: f32, %acc: f32):",
            "    %m = arith.mulf %in, %k : f32",
            "    %s = arith.addf %acc, %m : f32",
            "    linalg.yield %s : f32",
            f"  }} -> {t(n, oh, ow, c)}",
        ]
        result = "%o"
        if self.bias:
            identity = "affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>"
            lines += [
                f"  %ob = linalg.generic {{indexing_maps = [{identity}, affine_map<(d0, d1, d2, d3) -> (d3)>, {identity}], "
                f"iterator_types = [\"parallel\", \"parallel\", \"parallel\", \"parallel\"]}} "
                f"ins(%o, %b : {t(n, oh, ow, c)}, {t(c)}) outs(%o0 : {t(n, oh, ow, c)}) {{",
                "  ^bb0(%a: f32, %bc: f32, %out: f32):",
                "    %s = arith.addf %a, %bc : f32",
                "    linalg.yield %s : f32",
                f"  }} -> {t(n, oh, ow, c)}",
            ]
            result = "%ob"
        lines += [
            f"  %r0 = tensor.empty() : {t(n, c, oh, ow)}",
            f"  %r = linalg.transpose ins({result} : {t(n, oh, ow, c)}) outs(%r0 : {t(n, c, oh, ow)}) permutation = [0, 3, 1, 2]",
            f"  return %r : {t(n, c, oh, ow)}",
            "}",
        ]
        return "\n".join(lines)

    def _single_channel_function(self) -> str:
        """The private function of a convolution of one input channel into `multiplier`
        output channels (an audio spectrogram's or a grayscale image's first convolution):
        one elementwise generic over [N, M, OH, OW] that sums the kernel's taps, each a
        strided slice of the padded input times a [M] column of the weight. IREE lowers
        the NCHW convolution with one input channel, or a windowed generic like the
        depthwise one's, without vectorizing it: 2.0-4.7 ms for a 3x3 one from 4x64x101
        to 16 channels (Intel Xeon, `iree-benchmark-module`), 0.44 ms in this form."""
        n, _, h, w = self.input
        kh, kw = self.kernel
        ph, pw = self.padding
        m = self.multiplier
        _, _, oh, ow = self.output
        (sh, sw), (dh, dw) = self.stride, self.dilation
        taps = kh * kw
        t = builtin_tensor

        bias_arg = f", %b: {t(m)}" if self.bias else ""
        padded = (n, h + 2 * ph, w + 2 * pw)
        lines = [
            f"func.func private @{self.name}(%x: {t(n, 1, h, w)}, %w: {t(m, 1, kh, kw)}{bias_arg}) -> {t(n, m, oh, ow)} {{",
            "  %zero = arith.constant 0.0 : f32",
            f"  %xc = tensor.collapse_shape %x [[0, 1], [2], [3]] : {t(n, 1, h, w)} into {t(n, h, w)}",
            f"  %xp = tensor.pad %xc low[0, {ph}, {pw}] high[0, {ph}, {pw}] {{",
            "  ^bb0(%i0: index, %i1: index, %i2: index):",
            "    tensor.yield %zero : f32",
            f"  }} : {t(n, h, w)} to {t(*padded)}",
            f"  %wc = tensor.collapse_shape %w [[0, 1, 2, 3]] : {t(m, 1, kh, kw)} into {t(m * taps)}",
            f"  %we = tensor.expand_shape %wc [[0, 1]] output_shape [{m}, {taps}] : {t(m * taps)} into {t(m, taps)}",
            f"  %wt0 = tensor.empty() : {t(taps, m)}",
            f"  %wt = linalg.transpose ins(%we : {t(m, taps)}) outs(%wt0 : {t(taps, m)}) permutation = [1, 0]",
        ]
        for i in range(kh):
            for j in range(kw):
                tap = i * kw + j
                lines += [
                    f"  %x{tap} = tensor.extract_slice %xp[0, {i * dh}, {j * dw}] [{n}, {oh}, {ow}] [1, {sh}, {sw}] "
                    f": {t(*padded)} to {t(n, oh, ow)}",
                    f"  %w{tap} = tensor.extract_slice %wt[{tap}, 0] [1, {m}] [1, 1] : {t(taps, m)} to {t(m)}",
                ]
        columns = [f"%w{tap}" for tap in range(taps)] + (["%b"] if self.bias else [])
        pixel, column, out = ("affine_map<(n, m, h, w) -> (n, h, w)>", "affine_map<(n, m, h, w) -> (m)>",
                              "affine_map<(n, m, h, w) -> (n, m, h, w)>")
        maps = ", ".join([pixel] * taps + [column] * len(columns) + [out])
        operands = ", ".join([f"%x{tap}" for tap in range(taps)] + columns)
        types = ", ".join([t(n, oh, ow)] * taps + [t(m)] * len(columns))
        block = ", ".join([f"%p{tap}: f32" for tap in range(taps)] + [f"%k{i}: f32" for i in range(len(columns))])
        lines += [
            f"  %o0 = tensor.empty() : {t(n, m, oh, ow)}",
            f"  %o = linalg.generic {{indexing_maps = [{maps}], iterator_types = "
            f"[\"parallel\", \"parallel\", \"parallel\", \"parallel\"]}} ins({operands} : {types}) "
            f"outs(%o0 : {t(n, m, oh, ow)}) {{",
            f"  ^bb0({block}, %acc: f32):",
            "    %s0 = arith.mulf %p0, %k0 : f32",
        ]
        for tap in range(1, taps):
            lines += [f"    %q{tap} = arith.mulf %p{tap}, %k{tap} : f32",
                      f"    %s{tap} = arith.addf %s{tap - 1}, %q{tap} : f32"]
        total = f"%s{taps - 1}"
        if self.bias:
            lines.append(f"    %sb = arith.addf {total}, %k{taps} : f32")
            total = "%sb"
        lines += [
            f"    linalg.yield {total} : f32",
            f"  }} -> {t(n, m, oh, ow)}",
            f"  return %o : {t(n, m, oh, ow)}",
            "}",
        ]
        return "\n".join(lines)


def depthwise_form(op: ir.Operation) -> Depthwise | None:
    """The form of a `torch.aten.convolution` this pass rewrites, else None."""
    if op.name != "torch.aten.convolution" or len(op.operands) != 9:
        return None
    x, weight, bias, stride, padding, dilation, transposed, _, groups = op.operands
    shape, kernel, out = f32_shape(x), f32_shape(weight), f32_shape(op.results[0])
    if shape is None or kernel is None or out is None or len(shape) != 4 or len(kernel) != 4 or len(out) != 4:
        return None
    channels = shape[1]
    if kernel[1] != 1 or torch_constant(groups, "int") != channels or out[1] != kernel[0] or kernel[0] % channels:
        return None
    multiplier = kernel[0] // channels
    if multiplier > 1 and (channels > 1 or kernel[2] * kernel[3] > MAX_TAPS):
        return None  # grouped ones are taps before import (frontend/decomp/grouped_conv.py)
    if torch_constant(transposed, "bool") is not False:
        return None
    pairs = [int_pair(v) for v in (stride, padding, dilation)]
    if None in pairs or min(pairs[1]) < 0 or min(pairs[0] + pairs[2]) < 1:
        return None
    if not is_none(bias) and f32_shape(bias) != [kernel[0]]:
        return None
    return Depthwise(tuple(shape), tuple(kernel[2:]), *pairs, tuple(out), bias=not is_none(bias),
                     multiplier=multiplier)


@register_pass(PASS_NAME)
def depthwise_nhwc(op: ir.Operation, pass_: object) -> None:
    """Rewrite each depthwise convolution into a call of its NHWC function."""
    for conv in ops_named(op, "torch.aten.convolution"):
        form = depthwise_form(conv)
        if form is None:
            continue
        operands = list(conv.operands[:3] if form.bias else conv.operands[:2])
        call_private_function(op, conv, form.name, form.function(), operands, [ir.F32Type.get()] * len(operands))
