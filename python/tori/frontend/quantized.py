"""Quantized graphs (PyTorch 2 export quantization, `quantized_decomposed` ops) in the
forms that reach IREE as integer contractions. A rewrite of the Dynamo graph, before
AOTAutograd: both rewrites change the ops a contraction's operands come from, which
a decomposition (seeing one op's inputs) cannot.

Torch-MLIR fuses `mm(dequantize(x), dequantize(w))` into an integer matmul with the
zero points subtracted and the scales applied after (i8 x i8 -> i32); IREE data-tiles
it for the CPU's integer dot-product instructions. Two forms escape it:

- uint8 activations (X86InductorQuantizer's default): the matmul becomes a generic
  of `extui` and `extsi` operands that IREE neither data-tiles nor gives a kernel
  (74 GOP/s for a 64x1024x512 one, against 548 for int8 x int8 and 266 GFLOP/s for
  float32; docs/quantization.md). An activation quantized to uint8 with zero point
  z is the same tensor quantized to int8 with zero point z - 128, shifted by 128: the
  pair's arguments are rewritten (exact).
- 2-D convolutions: Torch-MLIR fuses a convolution only with per-tensor weights, and
  PT2E quantizes weights per channel; the convolution then ran in float32 on
  dequantized operands. It becomes im2col of the int8 input (padded with the input's
  zero point, which dequantizes to 0) and one matmul against the int8 weight,
  reshaped to [O, C*kh*kw], each operand dequantized just before the matmul.

Never changes: quantize/dequantize pairs whose quantized tensor is used otherwise
(returned, or read by other ops), tensor-valued (dynamic) scales and zero points of
activations, grouped or transposed convolutions, and graphs without these ops.
"""

from __future__ import annotations

import logging

import torch
import torch.fx

log = logging.getLogger("tori.frontend.quantized")

aten = torch.ops.aten


def _ops():
    """The `quantized_decomposed` ops, or None where torch has not registered them."""
    try:
        import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the ops)
        return torch.ops.quantized_decomposed
    except (ImportError, AttributeError):
        return None


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target


def _signed_activations(gm: torch.fx.GraphModule, qd) -> int:
    """uint8 per-tensor quantize -> dequantize pairs with constant scale and zero point
    made int8, when every user of the quantized tensor is such a dequantize."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if not _is(node, qd.quantize_per_tensor.default) or len(node.args) != 6 or node.kwargs:
            continue
        _, scale, zero, low, high, dtype = node.args
        if dtype != torch.uint8 or (low, high) != (0, 255) or not isinstance(scale, float) or not isinstance(zero, int):
            continue
        users = list(node.users)
        if not users or not all(_is(u, qd.dequantize_per_tensor.default) and tuple(u.args[1:6]) == tuple(node.args[1:6])
                                and not u.kwargs for u in users):
            continue
        signed = (zero - 128, -128, 127, torch.int8)
        node.args = (node.args[0], scale, *signed)
        for user in users:
            user.args = (node, scale, *signed, *user.args[6:])
        rewritten += 1
    return rewritten


def quantized_conv2d(q_input: torch.Tensor, input_scale: float, input_zero: int, input_low: int, input_high: int,
                     q_weight: torch.Tensor, weight_scale, weight_zero, weight_low: int, weight_high: int,
                     per_channel: bool, bias: torch.Tensor | None, stride, padding, dilation) -> torch.Tensor:
    """conv2d(dequantize(q_input), dequantize(q_weight)) + bias as im2col of the int8
    input and one matmul of dequantized operands, which Torch-MLIR makes an integer one."""
    qd = torch.ops.quantized_decomposed
    batch, channels, height, width = q_input.shape
    outputs, _, kh, kw = q_weight.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    out_h = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    out_w = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    padded = aten.constant_pad_nd.default(q_input, [pw, pw, ph, ph], input_zero) if ph or pw else q_input
    taps = [padded[:, :, i * dh: i * dh + sh * (out_h - 1) + 1: sh, j * dw: j * dw + sw * (out_w - 1) + 1: sw]
            for i in range(kh) for j in range(kw)]
    # rows (n, oh, ow), columns in the weight's (c, kh, kw) order
    columns = torch.stack(taps, 2).permute(0, 3, 4, 1, 2).reshape(batch * out_h * out_w, channels * kh * kw)
    x = qd.dequantize_per_tensor.default(columns, input_scale, input_zero, input_low, input_high, torch.int8)
    flat = q_weight.reshape(outputs, channels * kh * kw)
    if per_channel:
        w = qd.dequantize_per_channel.default(flat, weight_scale, weight_zero, 0, weight_low, weight_high, torch.int8)
    else:
        w = qd.dequantize_per_tensor.default(flat, weight_scale, weight_zero, weight_low, weight_high, torch.int8)
    out = torch.mm(x, w.permute(1, 0)).reshape(batch, out_h, out_w, outputs).permute(0, 3, 1, 2)
    return out if bias is None else out + bias.reshape(1, outputs, 1, 1)


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
    """(input, weight, bias, stride, padding, dilation) of a 2-D, one-group, not
    transposed convolution node, else None."""
    if _is(node, aten.conv2d.default):
        names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
        values = dict(zip(names, node.args))
        values.update(node.kwargs)
        if values.get("groups", 1) != 1:
            return None
    elif _is(node, aten.convolution.default) and len(node.args) == 9 and not node.kwargs:
        x, w, b, stride, padding, dilation, transposed, _, groups = node.args
        if transposed or groups != 1:
            return None
        values = {"input": x, "weight": w, "bias": b, "stride": stride, "padding": padding, "dilation": dilation}
    else:
        return None
    pairs = [_pair(values.get(k), d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1))]
    if None in pairs:
        return None
    return values["input"], values["weight"], values.get("bias"), *pairs


def _rank(node) -> int | None:
    value = node.meta.get("example_value", node.meta.get("val")) if isinstance(node, torch.fx.Node) else None
    return value.dim() if isinstance(value, torch.Tensor) else None


def _integer_convolutions(gm: torch.fx.GraphModule, qd) -> int:
    rewritten = 0
    for node in list(gm.graph.nodes):
        found = _conv_args(node)
        if found is None:
            continue
        x, w, bias, stride, padding, dilation = found
        if not _is(x, qd.dequantize_per_tensor.default) or len(x.args) != 6 or x.kwargs:
            continue
        q_input, scale, zero, low, high, dtype = x.args
        if dtype != torch.int8 or not isinstance(scale, float) or not isinstance(zero, int) or _rank(q_input) != 4:
            continue
        if _is(w, qd.dequantize_per_channel.default) and len(w.args) >= 7 and not w.kwargs:
            q_weight, w_scale, w_zero, axis, w_low, w_high, w_dtype = w.args[:7]
            per_channel = True
            if axis != 0 or (len(w.args) > 7 and w.args[7] not in (None, torch.float32)):
                continue
        elif _is(w, qd.dequantize_per_tensor.default) and len(w.args) >= 6 and not w.kwargs:
            q_weight, w_scale, w_zero, w_low, w_high, w_dtype = w.args[:6]
            per_channel = False
            if len(w.args) > 6 and w.args[6] not in (None, torch.float32):
                continue
        else:
            continue
        if w_dtype != torch.int8 or _rank(q_weight) != 4:
            continue
        with gm.graph.inserting_before(node):
            replacement = gm.graph.call_function(quantized_conv2d, (
                q_input, scale, zero, low, high, q_weight, w_scale, w_zero, w_low, w_high, per_channel, bias,
                list(stride), list(padding), list(dilation)))
        replacement.meta = dict(node.meta)
        node.replace_all_uses_with(replacement)
        gm.graph.erase_node(node)
        rewritten += 1
    return rewritten


def rewrite_quantized(gm: torch.fx.GraphModule) -> int:
    """Rewrite a Dynamo graph's quantized patterns (above); the number of rewrites."""
    if not any(n.op == "call_function" and getattr(n.target, "namespace", None) == "quantized_decomposed"
               for n in gm.graph.nodes):
        return 0
    qd = _ops()
    if qd is None:
        return 0
    rewritten = _signed_activations(gm, qd) + _integer_convolutions(gm, qd)
    if rewritten:
        for node in reversed(list(gm.graph.nodes)):
            if node.op == "call_function" and not node.users and getattr(node.target, "namespace", None) == \
                    "quantized_decomposed":
                gm.graph.erase_node(node)
        gm.recompile()
        log.debug("rewrote %d quantized patterns", rewritten)
    return rewritten
