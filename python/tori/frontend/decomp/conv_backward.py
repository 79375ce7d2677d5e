"""Gradients of a convolution padded by more than its kernel reaches.

The input gradient of a convolution is a transposed convolution padded by
dilation * (kernel - 1) - padding on each side; where the padding is larger (a 1x1
kernel with padding 1, a 1-D convolution's size-1 kernel), that is negative and
Torch-MLIR's lowering of `convolution_backward` fails ("failed to legalize"). Here
the input is padded with zeros first and the convolution taken without padding: the
weight and bias gradients are the same, and the input gradient is that of the
padded input without its padding.
"""

from __future__ import annotations

import torch

from tori.frontend.decompositions import register_decomposition

aten = torch.ops.aten


@register_decomposition(aten.convolution_backward.default)
def padded_convolution_backward(op, grad_output, x, weight, bias_sizes, stride, padding, dilation, transposed,
                                output_padding, groups, output_mask):
    kernel = weight.shape[2:]
    if transposed or not any(p > d * (k - 1) for p, d, k in zip(padding, dilation, kernel)):
        return NotImplemented
    pads = [p for size in reversed(padding) for p in (size, size)]  # constant_pad_nd: last dim first
    padded = aten.constant_pad_nd.default(x, pads, 0.0)
    grad_input, grad_weight, grad_bias = op(grad_output, padded, weight, bias_sizes, stride, [0] * len(padding),
                                            dilation, transposed, output_padding, groups, output_mask)
    if grad_input is not None:
        for dim, size in enumerate(padding, start=2):
            grad_input = grad_input.narrow(dim, size, x.shape[dim])
    return grad_input, grad_weight, grad_bias
