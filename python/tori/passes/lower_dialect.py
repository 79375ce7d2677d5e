"""tori-lower-dialect: remove every `tori` op, so that IREE sees only the torch dialect.

Rewrites: each op of the `tori` dialect (an identity carrying facts) is replaced by
its operand: its result's uses take the operand, and the op is erased. The compile
runs this pass after the user's pipeline, whatever that pipeline is, and then
`check_lowered` fails the compile if any `tori.` op is left.

Never changes: any op of another dialect, or the types of values; what the facts
implied has been made explicit in the torch dialect by then (tori-specialize-guards)
or is dropped with them.

Example:
    %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, divisor = 1 : i64, max = "inf", min = 2 : i64}
           : (!torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32>
    %1 = torch.aten.relu %0 : !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
becomes
    %0 = torch.aten.relu %arg0 : !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
"""

from __future__ import annotations

from torch_mlir import ir

from tori.dialects.tori import OP_NAMES
from tori.errors import CompileError
from tori.passes.depthwise_nhwc import PASS_NAME as DEPTHWISE_PASS
from tori.passes.erf_polynomial import PASS_NAME as ERF_PASS
from tori.passes.int8_weight_matmul import PASS_NAME as INT8_WEIGHT_PASS
from tori.passes.materialize_masks import PASS_NAME as MASKS_PASS
from tori.passes.matching import walk
from tori.passes.packed_attention import PASS_NAME as ATTENTION_PASS
from tori.passes.packed_matmul import PASS_NAME as PACKED_PASS
from tori.passes.pooling_nhwc import PASS_NAME as POOLING_PASS
from tori.passes.registry import register_pass, run_pipeline
from tori.passes.row_reductions import PASS_NAME as ROWS_PASS
from tori.passes.widen_16_bit import PASS_NAME as WIDEN_PASS
from tori.stages import Stage

PASS_NAME = "tori-lower-dialect"


def _tori_ops(op: ir.Operation, names=None) -> list[ir.Operation]:
    """The ops nested in `op` whose dialect is `tori` (of `names`, when given), in order."""
    found = []
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                child = child.operation
                if (child.name in names) if names is not None else child.name.startswith("tori."):
                    found.append(child)
                found.extend(_tori_ops(child, names))
    return found


@register_pass(PASS_NAME)
def lower_dialect(op: ir.Operation, pass_: object) -> None:
    """Replace every tori op (an identity carrying facts) by its operand."""
    for tori_op in _tori_ops(op, OP_NAMES):
        tori_op.results[0].replace_all_uses_with(tori_op.operands[0])
        tori_op.erase()


def check_lowered(module: ir.Module, *, graph: str = "") -> None:
    """Raise CompileError when an op of the tori dialect is left in `module`."""
    left = _tori_ops(module.operation)
    if left:
        names = sorted({op.name for op in left})
        raise CompileError(
            f"{len(left)} op(s) of the tori dialect ({', '.join(names)}) are left after {PASS_NAME}; "
            "IREE cannot compile them. A pass of the pipeline made an op that tori-lower-dialect "
            "does not know: remove that pass or lower its op first",
            stage=Stage.TORI.value, graph=graph, op=names[0], location=str(left[0].location),
        )


def lower_for_iree(module: ir.Module, options, *, graph: str = "", text: str | None = None,
                   codegen=None) -> None:
    """Run tori-lower-dialect over `module` and check that no tori op is left; then give
    depthwise convolutions IREE's channels-last kernel (tori-depthwise-nhwc), max
    pooling IREE's channels-last one where the code generation rule makes the
    convolutions channels last (tori-pooling-nhwc), an attention's exponentials
    the packed layout of the matmul that reads them (tori-packed-attention, before the
    row reductions take their sums; its lanes from `packed_attention_lanes`),
    reductions over the last
    dimension vector lanes (tori-row-reductions; a layer normalization's mean and
    variance one pass), matmuls
    against widened int8 weights one contraction (tori-int8-weight-matmul) and 16-bit
    float contractions float32 operands where the CPU has no arithmetic for them
    (tori-widen-16-bit), float tensors selected by boolean inputs dispatches of their
    own (tori-materialize-masks), float32 matmuls tori's packed tiles
    (tori-packed-matmul), and erf one polynomial (tori-erf-polynomial), whatever the
    user's pipeline. `codegen` is the graph's
    targets.codegen.Strategy (None: IREE's defaults): its rules for `options.target`
    give the packed tile and whether the convolutions are channels last. The last seven apply where every target of `options`
    (tori Options) is a CPU (the contractions may then carry IREE's CPU tiling and data
    tiling). `text`: the module printed, where the caller has it (`run_pipeline`)."""
    from tori.targets.build import compiled_targets, cpu_only
    from tori.targets.codegen import packed_attention_lanes
    from tori.targets.cpu import float16_types_without_arithmetic

    only_cpu = cpu_only(compiled_targets(options))
    missing = float16_types_without_arithmetic(options.cpu) if only_cpu and _has_16_bit_values(module) \
        else frozenset()
    int8 = f"{INT8_WEIGHT_PASS}{{cpu={str(only_cpu).lower()}}}"
    widen = f"{WIDEN_PASS}{{bf16={str('bf16' in missing).lower()} f16={str('f16' in missing).lower()}}}"
    masks = f"{MASKS_PASS}{{cpu={str(only_cpu).lower()}}}"
    # Its transposes cancel against those of channels-last convolutions; beside IREE's
    # default ones they are two more dispatches (the benchmarks' cnn_bn, 0.045 GFLOP of
    # convolutions: tori/eager 0.77-0.78 with them, 0.56-0.62 without, runs alternating).
    channels_last = codegen is not None and codegen.channels_last(options.target)
    pooling = f"{POOLING_PASS}{{cpu={str(only_cpu and channels_last).lower()}}}"
    reductions = f"{ROWS_PASS}{{cpu={str(only_cpu).lower()}}}"
    rows, cols = codegen.packed_tile(options.target) if only_cpu and codegen is not None else (0, 0)
    packed = f"{PACKED_PASS}{{rows={rows} cols={cols}}}"
    attention = f"{ATTENTION_PASS}{{lanes={packed_attention_lanes(options)}}}"
    erf = f"{ERF_PASS}{{cpu={str(only_cpu).lower()}}}"
    run_pipeline(module, f"{PASS_NAME}, {DEPTHWISE_PASS}, {pooling}, {attention}, {reductions}, {int8}, {widen}, "
                 f"{masks}, {packed}, {erf}", graph=graph, text=text)
    check_lowered(module, graph=graph)


def _has_16_bit_values(module: ir.Module) -> bool:
    """Whether an op of `module` makes a bf16 or f16 tensor (the CPU's features are
    asked only then)."""
    return any(str(result.type).endswith(("bf16>", "f16>")) for op in walk(module.operation) for result in op.results)
