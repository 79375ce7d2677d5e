"""tori-pooling-nhwc: a 2-D max pooling reaches IREE in channels-last form,
`linalg.pooling_nhwc_max` between two transposes.

Torch-MLIR lowers max pooling of an NCHW input to `linalg.pooling_nchw_max`, whose
vectors run along the image row: a stride-2 window then gathers every other value.
ResNet's stem pooling (64 channels, 113x113 to 56x56, 8 images) took 11.6 ms that
way on an AVX-512 Xeon (`tori profile`), about 1.2 G windows' values a second, for
26 MB read. Channels last, a window's values are whole vectors of channels, and
IREE cancels the transposes against those of the channels-last convolutions around
it (docs/performance.md).

Rewrites: `torch.aten.max_pool2d_with_indices` whose indices nobody reads, and
`torch.aten.max_pool2d`, of a static [N, C, H, W] float32 input with constant
kernel, strides, padding and dilations, into a call of a private function of builtin
tensors (one per distinct form) that transposes the input to NHWC, pads it with
-inf, pools and transposes back; `torch_c` casts around the call. The compile runs
this pass before IREE for modules compiled only for CPUs whose convolutions the code
generation rule makes channels last (`lower_for_iree`; `cpu=false` changes nothing):
beside IREE's default NCHW convolutions the transposes stay, two dispatches more (the
benchmarks' cnn_bn: tori/eager 0.77-0.78 with them, 0.56-0.62 without, runs alternating).

Never changes: a pooling whose indices are read (tori's decompositions take a
training step's indices from comparisons with the pooled values, so its forward
pooling is rewritten too), ceil-mode windows that would start past the padded
input, dynamic shapes, other element types, 1-D and 3-D pooling, and every other op.

Example:
    %r0, %r1 = torch.aten.max_pool2d_with_indices %x, [3,3], [2,2], [0,0], [1,1], %false
           : !torch.vtensor<[8,64,113,113],f32>, ... -> !torch.vtensor<[8,64,56,56],f32>, !torch.vtensor<[8,64,56,56],si64>
becomes (when %r1 has no use)
    %0 = "torch_c.to_builtin_tensor"(%x) : (...) -> tensor<8x64x113x113xf32>
    %1 = func.call @tori_max_pool_8x64x113x113_3x3_s2x2_p0x0_d1x1_f32(%0) : ... -> tensor<8x64x56x56xf32>
    %r0 = "torch_c.from_builtin_tensor"(%1) : (tensor<8x64x56x56xf32>) -> !torch.vtensor<[8,64,56,56],f32>
    func.func private @tori_max_pool_8x64x113x113_3x3_s2x2_p0x0_d1x1_f32(...) {
      (transpose to NHWC, pad with -inf where windows read past the input,
       linalg.pooling_nhwc_max, util.optimization_barrier, transpose back)
    }

The barrier keeps the pooling a dispatch of its own: without it IREE fused the
pooling into each convolution that reads it, recomputing the windows per tile
(ResNet-18 at 8 images 215 -> 330 ms).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch_mlir import ir

from tori.passes.builtin_calls import builtin_tensor, call_private_function, f32_shape, int_pair, ops_named
from tori.passes.depthwise_nhwc import WindowForm
from tori.passes.registry import register_pass

PASS_NAME = "tori-pooling-nhwc"
POOLING_OPS = ("torch.aten.max_pool2d_with_indices", "torch.aten.max_pool2d")
# float32's -inf, which no window's maximum can be below: the value of padding.
_NEGATIVE_INFINITY = "0xFF800000"


@dataclass(frozen=True)
class MaxPool(WindowForm):
    """One form of max pooling."""

    @property
    def name(self) -> str:
        return f"tori_max_pool_{self.signature()}_f32"

    def extent(self, axis: int) -> int:
        """The padded input length the windows of `axis` (0: rows, 1: columns) cover."""
        return (self.output[2 + axis] - 1) * self.stride[axis] + (self.kernel[axis] - 1) * self.dilation[axis] + 1

    def high_padding(self, axis: int) -> int:
        """The padding after the input along `axis` that the windows read: the pooling's
        own where its windows reach it, more in ceil mode, less where they stop short."""
        return self.extent(axis) - self.input[2 + axis] - self.padding[axis]

    def function(self) -> str:
        """The private function's MLIR text."""
        n, c, h, w = self.input
        _, _, oh, ow = self.output
        (ph, pw), (sh, sw), (dh, dw) = self.padding, self.stride, self.dilation
        high = (self.high_padding(0), self.high_padding(1))
        lines = [
            f"func.func private @{self.name}(%x: {builtin_tensor(n, c, h, w)}) -> {builtin_tensor(n, c, oh, ow)} {{",
            f"  %lowest = arith.constant {_NEGATIVE_INFINITY} : f32",
            f"  %xt0 = tensor.empty() : {builtin_tensor(n, h, w, c)}",
            f"  %xt = linalg.transpose ins(%x : {builtin_tensor(n, c, h, w)}) outs(%xt0 : {builtin_tensor(n, h, w, c)}) "
            "permutation = [0, 2, 3, 1]",
        ]
        source, shape = "%xt", (n, h, w, c)
        if high[0] < 0 or high[1] < 0:  # the last rows or columns are in no window
            shape = (n, min(h, h + high[0]), min(w, w + high[1]), c)
            lines.append(f"  %xs = tensor.extract_slice %xt[0, 0, 0, 0] [{', '.join(map(str, shape))}] [1, 1, 1, 1] "
                         f": {builtin_tensor(n, h, w, c)} to {builtin_tensor(*shape)}")
            source, high = "%xs", (max(high[0], 0), max(high[1], 0))
        if ph or pw or any(high):
            padded = (n, self.extent(0), self.extent(1), c)
            lines += [
                f"  %xp = tensor.pad {source} low[0, {ph}, {pw}, 0] high[0, {high[0]}, {high[1]}, 0] {{",
                "  ^bb0(%i0: index, %i1: index, %i2: index, %i3: index):",
                "    tensor.yield %lowest : f32",
                f"  }} : {builtin_tensor(*shape)} to {builtin_tensor(*padded)}",
            ]
            source, shape = "%xp", padded
        lines += [
            f"  %window = tensor.empty() : {builtin_tensor(*self.kernel)}",
            f"  %o0 = tensor.empty() : {builtin_tensor(n, oh, ow, c)}",
            f"  %of = linalg.fill ins(%lowest : f32) outs(%o0 : {builtin_tensor(n, oh, ow, c)}) -> {builtin_tensor(n, oh, ow, c)}",
            f"  %o = linalg.pooling_nhwc_max {{dilations = dense<[{dh}, {dw}]> : vector<2xi64>, "
            f"strides = dense<[{sh}, {sw}]> : vector<2xi64>}} ins({source}, %window : {builtin_tensor(*shape)}, "
            f"{builtin_tensor(*self.kernel)}) outs(%of : {builtin_tensor(n, oh, ow, c)}) -> {builtin_tensor(n, oh, ow, c)}",
            f"  %ob = \"util.optimization_barrier\"(%o) : ({builtin_tensor(n, oh, ow, c)}) -> {builtin_tensor(n, oh, ow, c)}",
            f"  %r0 = tensor.empty() : {builtin_tensor(n, c, oh, ow)}",
            f"  %r = linalg.transpose ins(%ob : {builtin_tensor(n, oh, ow, c)}) outs(%r0 : {builtin_tensor(n, c, oh, ow)}) "
            "permutation = [0, 3, 1, 2]",
            f"  return %r : {builtin_tensor(n, c, oh, ow)}",
            "}",
        ]
        return "\n".join(lines)


def max_pool_form(op: ir.Operation) -> MaxPool | None:
    """The form of a max pooling this pass rewrites, else None."""
    if op.name not in POOLING_OPS or len(op.operands) != 6:
        return None
    if len(op.results) == 2 and list(op.results[1].uses):
        return None  # the indices feed a backward pass
    shape, out = f32_shape(op.operands[0]), f32_shape(op.results[0])
    if shape is None or out is None or len(shape) != 4 or len(out) != 4 or out[:2] != shape[:2]:
        return None
    pairs = [int_pair(v) for v in op.operands[1:5]]
    if None in pairs:
        return None
    kernel, stride, padding, dilation = pairs
    if min(kernel + stride + dilation) < 1 or min(padding) < 0:
        return None
    form = MaxPool(tuple(shape), kernel, stride, padding, dilation, tuple(out))
    # In ceil mode the last window may start in the padding after the input (where
    # ATen drops it); only windows that start inside the input or its low padding.
    for axis in (0, 1):
        if (out[2 + axis] - 1) * stride[axis] >= shape[2 + axis] + padding[axis]:
            return None
    return form


@register_pass(PASS_NAME)
def pooling_nhwc(op: ir.Operation, pass_: object, *, cpu: bool = True) -> None:
    """Rewrite each float32 2-D max pooling into a call of its NHWC function."""
    if not cpu:
        return
    for name in POOLING_OPS:
        for pool in ops_named(op, name):
            form = max_pool_form(pool)
            if form is not None:
                call_private_function(op, pool, form.name, form.function(), [pool.operands[0]], [ir.F32Type.get()])
