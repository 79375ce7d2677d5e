"""Code generation per op family: which iree-compile flags a graph gets for a target,
chosen from the op families it holds (2-D convolutions, matmuls), as one table of
rules, each with the measurement that justified it.

IREE's flags act on a whole module, so a rule applies per graph: a graph with a
convolution gets the convolution rule, one with only matmuls the matmul rule. Of a
family's rules, the first whose conditions the graph and the target CPU meet applies. A
flag the user names in `iree_flags` wins over a rule's (iree-compile refuses a
flag given twice); `codegen="none"` applies no rule.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.fx

from tori.config import Codegen, Options
from tori.passes.packed_matmul import packable
from tori.targets import Target
from tori.targets.kernel_configs import (DIRECT_CONV_TILE, NARROW_BATCH_MATMUL, NARROW_ROWS, PACKED_EXPONENTIALS, SPEC_FLAG,
                                         TUNING_SPEC_FLAG, KernelConfig, direct_convolution, spec_path,
                                         tuning_spec_path)

_aten = torch.ops.aten

PREPROCESSING_FLAG = "--iree-preprocessing-pass-pipeline"


class Family(str, enum.Enum):
    CONV2D = "convolution"          # 2-D, one group, not transposed
    GROUPED_CONV = "grouped convolution"  # depthwise and other grouped 2-D convolutions
    MATMUL = "matmul"               # mm, addmm, bmm, baddbmm, _int_mm (linear layers, attention, int8)
    # bmm and baddbmm with NARROW_ROWS rows per batch: a decoding step's attention
    NARROW_BATCH_MATMUL = "narrow batched matmul"
    # mm and addmm of WIDE_MIN_ROWS rows or more onto a right operand of WIDE_WEIGHT_BYTES
    # or more: a language model's output projection onto its vocabulary
    WIDE_MATMUL = "matmul onto a large weight"
    # other float32 mm and addmm of PACKED_MIN_ROWS rows or more onto PACKED_MIN_COLUMNS
    # columns or more, reducing PACKED_MIN_DEPTH or more, of PACKED_MIN_FLOP or more,
    # static: a linear layer over a sequence or a batch of images
    FLOAT_MATMUL = "float32 matmul"
    # an attention's exponentials in tori-packed-attention's form, which that pass
    # writes packed for the batched matmul that reads them
    ATTENTION = "attention exponentials"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Rule:
    """Flags for one op family on one target; `preprocessing` are passes of IREE's
    preprocessing pipeline (merged, in table order, into one flag)."""

    target: Target
    family: Family
    name: str
    flags: tuple[str, ...] = ()
    preprocessing: tuple[str, ...] = ()
    # The least work of the family in the graph (GFLOP per call) for the rule to apply.
    min_gflop: float = 0.0
    # LLVM features of which the target CPU needs one for the rule to apply ("+avx512f");
    # where it has none, the next rule of the family in the table does.
    cpu_features: tuple[str, ...] = ()
    # Tile sizes tori gives IREE for the family's ops (targets/kernel_configs.py),
    # merged, in table order, into one transform spec.
    kernels: tuple[KernelConfig, ...] = ()
    # The (rows, columns) tile of tori's packed float32 matmuls (passes/packed_matmul.py)
    # for the family's matmuls; IREE's microkernels know only their own tiles, so the
    # rule's flags turn them off.
    packed_tile: tuple[int, int] | None = None
    # Kernel configurations IREE's code generation gives the family's ops where it
    # chooses each dispatch's configuration (targets/kernel_configs.py's tuning specs),
    # merged, in table order, into one tuning spec.
    tuning: tuple[str, ...] = ()
    # Tuning matchers for the family's ops by their shapes: each op's, or None.
    shaped_tuning: Callable[[torch.fx.Node], str | None] | None = None
    evidence: str = ""


_CHANNELS_LAST = "iree-preprocessing-convert-conv-to-channels-last"
_IMG2COL = "iree-global-opt-convert-conv2d-to-img2col"
_DATA_TILING = "--iree-opt-data-tiling=true"
# IREE's other data-tiling path, from global optimization rather than dispatch creation
# (the one --iree-opt-data-tiling picks): where the first fails to compile a graph, it
# may not. A causal attention's backward (its i1 mask fused into a data-tiled matmul's
# dispatch fails to encode) compiles with it: 6-block transformer, width 256, 64 tokens,
# batch 8, one thread, backward 168 ms with IREE's defaults, 114 with it (eager 79).
_GLOBAL_DATA_TILING = "--iree-global-opt-data-tiling"
_UKERNELS = "--iree-llvmcpu-enable-ukernels"
_NO_UKERNELS = f"{_UKERNELS}=none"
# tori's packed matmul tile for AVX-512 float32: 28 of its 32 registers accumulate.
_AVX512_PACKED_TILE = (14, 32)
# The bytes of each operand's tile that a workgroup of a data-tiled matmul takes (IREE's
# default 256 KiB); larger tiles give a workgroup more rows, so that fewer workgroups
# read each column tile of the right operand from memory. IREE's default gave Llama's
# output projection at 8 sequences (1024 rows onto 32000 columns of 512) workgroups of
# 32 rows by 80 columns: the 65.5 MB weight read from memory 32 times per call.
_WIDE_TILE_BYTES = "--iree-llvmcpu-matmul-tile-bytes=2097152"

# The matmuls of the wide rule: at least WIDE_MIN_ROWS rows (the left operand's), a
# right operand of at least WIDE_WEIGHT_BYTES (beyond the caches, read from memory).
WIDE_MIN_ROWS = 32
WIDE_WEIGHT_BYTES = 32 << 20

# LLVM features of a CPU for which IREE's direct channels-last convolution kernel is
# faster than img2col's columns and a matmul (measured on AVX-512 against AVX2 code).
DIRECT_CONVOLUTION_FEATURES = ("+avx512f",)

ATTENTION_EVIDENCE = (
    "DeiT-small's attention at 8 images (48 heads of 197 queries and keys, 2 cores, Intel Xeon with AVX-512, "
    "2026-12-06): IREE packed the exponentials for `e @ [v | 1]` in the dispatch that computes them, one "
    "scalar store per value, 1.97 ms a layer; written packed by tori with a 16x16 vector tile 0.69-0.78 ms, and "
    "`e @ v` on 16x16 tiles without the column of ones (65 columns padded to 80) 1.71 -> 1.32-1.47 ms. Whole "
    "models, both forms in one process, calls alternating: DeiT-small at 8 images 454.6 -> 435.1 ms (faster in "
    "46 of 70 pairs), BERT at 8 sequences 333.3 -> 320.7 (43 of 62). The configuration reaches IREE as a "
    "tuning spec: given on the op, IREE's reshapes rebuilt the op without it; behind optimization barriers it "
    "held, but DeiT-small ran 25 ms slower a call")


PACKED_EVIDENCE = (
    "DeiT-small at 8 images, 2 cores (Intel Xeon with AVX-512, 2026-12-05): 436-447 ms with IREE's data-tiled "
    "16x16 tiles, 376-380 in tori's 14x32 (eager 295-340 in the same processes); its MLP matmul "
    "1576x384x1536 alone as linalg.mmt4d 8.4-8.9 ms in 16x16 tiles, 7.4 in 14x32 or 12x32, 9.0 in 8x32, "
    "9.7 in 6x64 (eager 5.6); the MLP with its GELU 18.6 -> 15.8 ms")


def _direct_convolution_tuning(node: torch.fx.Node) -> str | None:
    """The tuning matcher that gives a float32 convolution IREE's direct kernel in
    tori's tile (kernel_configs.direct_convolution): one of stride 1 or 2, no dilation,
    a kernel larger than 1x1 (1x1 convolutions are matmuls), its output columns and
    channels whole tiles; else None."""
    out, weight, value = _shape(node), _shape(node.args[1]), node.meta.get("val")
    stride, dilation = tuple(node.args[3]), tuple(node.args[5])
    if out is None or weight is None or len(out) != 4 or value.dtype != torch.float32 or weight[2:] == (1, 1):
        return None
    if set(dilation) != {1} or len(set(stride)) != 1 or stride[0] not in (1, 2):
        return None
    columns, channels = out[3], out[1]
    rows, lanes = DIRECT_CONV_TILE
    return direct_convolution(stride[0], columns, channels) if columns % rows == 0 and channels % lanes == 0 else None


# Measured with benchmarks/bench_models.py and iree-profile (docs/performance.md,
# "Code generation per op family"); batch 1, 224x224 images, 2 cores.
RULES: tuple[Rule, ...] = (
    Rule(Target.CPU, Family.CONV2D, "channels-last convolutions, data-tiled matmuls",
         flags=(_DATA_TILING,), preprocessing=(_CHANNELS_LAST,), min_gflop=0.1,
         cpu_features=DIRECT_CONVOLUTION_FEATURES, shaped_tuning=_direct_convolution_tuning,
         evidence="IREE's direct channels-last convolution against img2col and a data-tiled matmul, 8 images (AMD "
                  "EPYC with AVX-512, 2026-12-03): two 3x3 convolutions with BatchNorm and ReLU, 64 channels at "
                  "56x56 20.4 ms against 67.5 (img2col's columns alone 14-19 ms each), 128 at 28x28 19.0 against "
                  "104.7, 256 at 14x14 20.1 against 137.3, 512 at 7x7 27.9 against 42.4; ResNet-18 at batch 8 "
                  "0.61-0.71x eager's time before, 1.21-1.26x after. 1x1 convolutions reach IREE as matmuls "
                  "(frontend/decomp/grouped_conv.py), which data tiling packs. For an AVX2 CPU (haswell) the "
                  "direct kernel ran ResNet-18 at batch 8 in 6343 ms against img2col's 911: hence AVX-512 only. Its "
                  "convolutions of whole 14x32 tiles get that register tile (a tuning spec, "
                  "kernel_configs.direct_convolution; Intel Xeon, 2026-12-06, one process, calls alternating): "
                  "ResNet-18 at 8 images 211.5 -> 176.6 ms (faster in 108 of 109 pairs), at one 33.0 -> 29.7; "
                  "ResNet-50 467.6 -> 428.5 and 66.6 -> 63.6"),
    Rule(Target.CPU, Family.CONV2D, "channels-last, img2col, data-tiled matmul",
         flags=(_DATA_TILING,), preprocessing=(_CHANNELS_LAST, _IMG2COL), min_gflop=0.1,
         evidence="ResNet-18 (3.6 GFLOP): 84.5 ms by default, 46.4 with channels-last and img2col, 28.0 with data "
                  "tiling too (eager 17.6; Xeon with AVX-512, 2026-12-01), 541 -> 76 ms on an AVX2 EPYC; but the "
                  "benchmarks' cnn_bn (0.045 GFLOP, 16-64 channels at 32x32) 0.51 -> 1.21 ms, so small graphs keep "
                  "the default"),
    Rule(Target.CPU, Family.NARROW_BATCH_MATMUL, "tori's narrow batched matmul tiles", kernels=NARROW_BATCH_MATMUL,
         evidence="static-cache decoding step of a 4-layer Llama, 8 query heads on 4 key/value heads (2 rows per "
                  "batch), 2048 cached positions, one thread (AMD EPYC with AVX-512, 2026-12-04): with data tiling "
                  "IREE re-packed both caches per call, 1.97 ms of the step's 6.26 ms of dispatches, its two "
                  "products about 0.27 ms; without data tiling its own tiles took 1.10 and 0.55 ms; these 0.49 and "
                  "0.28 ms, no packing, the step 7.30-8.23 -> 6.21-6.24 ms. Compiled for an AVX2 CPU (haswell) "
                  "the products and packing took 2.33 ms, these 0.86. 1 and 4 rows (8 and 2 key/value heads): "
                  "2.54-2.64 -> 1.26-1.28 ms and 1.24 -> 0.74-0.94 ms per step"),
    Rule(Target.CPU, Family.WIDE_MATMUL, "data-tiled matmul, larger workgroup tiles",
         flags=(_DATA_TILING, _WIDE_TILE_BYTES), min_gflop=0.01,
         evidence="whole models after the driver trials, 2 cores (Intel Xeon with AVX-512, 2026-12-04), with "
                  "IREE's default 256 KiB tiles, 512 KiB and 2 MiB: GPT-2 at one sequence of 128 tokens 98.0, "
                  "73.3 and 72.3 ms (eager 58.1-58.9), at 8 sequences 688.3, 560.3 and 539.0 (eager 391-426); "
                  "Llama prefill at 8 sequences 350.9 by default, 268.2 with 1 MiB, 257.9 with 2 MiB (eager "
                  "216-236), at one 39.0, 36.3 and 37.5 (eager 32.7-34.0). Llama's output projection alone "
                  "(1024x32000x512): 282.6 ms by default, 161.8-165.0 with 1-4 MiB, 197.2 with 8 MiB (eager "
                  "132-142); 16 rows onto 768x32000 9.2 ms by default, 9.5 with 512 KiB. The flag acts on the "
                  "whole module, and graphs without such a weight keep the matmul rule alone: ViT at 8 images "
                  "476.3 ms by default, 508.3 with 2 MiB. (An earlier bound of 512 rows came from timings that "
                  "mixed the driver trials' local-sync calls into local-task's.)"),
    Rule(Target.CPU, Family.ATTENTION, "tori's packed attention, 16 queries by 16 keys a vector tile",
         cpu_features=("+avx512f",), tuning=(PACKED_EXPONENTIALS,), evidence=ATTENTION_EVIDENCE),
    Rule(Target.CPU, Family.FLOAT_MATMUL, "tori's packed 14x32 tiles", flags=(_DATA_TILING, _NO_UKERNELS),
         min_gflop=0.01, cpu_features=("+avx512f",), packed_tile=_AVX512_PACKED_TILE, evidence=PACKED_EVIDENCE),
    Rule(Target.CPU, Family.FLOAT_MATMUL, "data-tiled matmul", flags=(_DATA_TILING,), min_gflop=0.01,
         evidence="as the matmul rule's, below"),
    Rule(Target.CPU, Family.MATMUL, "data-tiled matmul", flags=(_DATA_TILING,), min_gflop=0.01,
         evidence="DeiT-tiny: 70.4 ms by default, 22.0 with data tiling (eager 12.6); a 1024 fp32 matmul "
                  "58 -> 156 GFLOP/s on an AVX2 EPYC; matmul+relu graphs on a Zen 5 EPYC: 256x512x512 "
                  "(0.134 GFLOP) 464-546 us with it, 646-906 without, but at 0.001 GFLOP and less no faster "
                  "(17.2-17.5 against 15.7-15.8 us at 8x64x64) while iree-compile took 0.1-0.15 s longer, "
                  "about 30%, so smaller graphs keep the default"),
)


@dataclass(frozen=True)
class FamilyUse:
    family: Family
    ops: int
    gflop: float  # per call, from the graph's shapes (symbolic sizes at their traced example sizes)


@dataclass(frozen=True)
class Strategy:
    """The rules chosen for one graph and the flags they give each target."""

    uses: tuple[FamilyUse, ...] = ()
    rules: tuple[Rule, ...] = ()
    flags: dict[Target, tuple[str, ...]] = field(default_factory=dict)
    dropped: str = ""  # why the chosen rules were dropped again (their flags made iree-compile fail)

    def flags_for(self, target: Target) -> tuple[str, ...]:
        return self.flags.get(target, ())

    def packed_tile(self, target: Target) -> tuple[int, int]:
        """The tile of tori's packed matmuls for `target`, (0, 0) where IREE packs them."""
        return next((r.packed_tile for r in self.rules if r.target is target and r.packed_tile), (0, 0))

    def channels_last(self, target: Target) -> bool:
        """Whether IREE makes the convolutions channels last for `target` (a rule's
        preprocessing)."""
        return any(_CHANNELS_LAST in r.preprocessing for r in self.rules if r.target is target)

    def without_rules(self, reason: str) -> "Strategy":
        return Strategy(self.uses, dropped=reason)

    def other_data_tiling_path(self, target: Target, reason: str) -> "Strategy | None":
        """The same rules with IREE's global-optimization data-tiling path for `target`,
        None where they do not data-tile (or already take that path)."""
        flags = self.flags_for(target)
        if _DATA_TILING not in flags:
            return None
        other = tuple(_GLOBAL_DATA_TILING if f == _DATA_TILING else f for f in flags)
        return Strategy(self.uses, self.rules, {**self.flags, target: other},
                        dropped=f"global-optimization data tiling: the default path failed: {reason}")

    def __str__(self) -> str:
        if not self.rules:
            return f"IREE defaults ({self.dropped})" if self.dropped else "IREE defaults"
        text = "; ".join(f"{r.family} on {r.target.value}: {r.name}" for r in self.rules)
        return f"{text} ({self.dropped})" if self.dropped else text

    def describe(self) -> list[dict]:
        """Per op family in the graph: its ops, work and the rule applied (for reports)."""
        chosen = {(r.family, r.target): r for r in self.rules}
        rows = []
        for use in self.uses:
            for target in {r.target for r in self.rules} or {None}:
                rule = chosen.get((use.family, target))
                rows.append({"family": str(use.family), "ops": use.ops, "gflop": round(use.gflop, 3),
                             "target": target.value if target else None, "rule": rule.name if rule else "IREE default",
                             "evidence": rule.evidence if rule else ""})
        return rows


MATMUL_OPS = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten._int_mm.default}


def _shape(node) -> tuple[int, ...] | None:
    """A node's shape, a symbolic size read as the example size it was traced with."""
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    sizes = [d if isinstance(d, int) else getattr(d.node, "hint", None) for d in value.shape]
    return tuple(sizes) if all(isinstance(d, int) for d in sizes) else None


def _conv_family(node: torch.fx.Node) -> Family | None:
    weight = _shape(node.args[1])
    transposed, groups = node.args[6], node.args[8]
    if weight is None or len(weight) != 4 or transposed:
        return None
    return Family.CONV2D if groups == 1 else Family.GROUPED_CONV


def conv_flop(out_shape, weight_shape) -> float:
    """A convolution's multiply-adds, counted twice: each output element reads its
    group's input channels through the whole kernel (weight [O, C/groups, *kernel])."""
    return 2.0 * math.prod(out_shape) * math.prod(weight_shape[1:])


def _flops(node: torch.fx.Node) -> float:
    out = _shape(node)
    if out is None:
        return 0.0
    if node.target is _aten.convolution.default:
        weight = _shape(node.args[1])
        return conv_flop(out, weight) if weight else 0.0
    # A matmul's reduction size is its first matrix operand's last dim.
    first = _shape(node.args[1] if node.target in (_aten.addmm.default, _aten.baddbmm.default) else node.args[0])
    return 2.0 * math.prod(out) * first[-1] if first else 0.0


def _narrow(node: torch.fx.Node) -> bool:
    """A batched matmul with NARROW_ROWS rows per batch (its result [B, rows, N])."""
    out = _shape(node)
    return node.target in (_aten.bmm.default, _aten.baddbmm.default) and out is not None and len(out) == 3 \
        and out[1] in NARROW_ROWS


def _wide(node: torch.fx.Node) -> bool:
    """A matmul of WIDE_MIN_ROWS rows or more onto a right operand of WIDE_WEIGHT_BYTES or more."""
    if node.target not in (_aten.mm.default, _aten.addmm.default):
        return False
    out, right = _shape(node), _shape(node.args[-1])
    value = node.args[-1].meta.get("val") if isinstance(node.args[-1], torch.fx.Node) else None
    if out is None or right is None or len(out) != 2 or len(right) != 2 or value is None:
        return False
    return out[0] >= WIDE_MIN_ROWS and math.prod(right) * value.element_size() >= WIDE_WEIGHT_BYTES


def _packable(node: torch.fx.Node) -> bool:
    """A static float32 mm or addmm of PACKED_MIN_ROWS rows or more onto
    PACKED_MIN_COLUMNS columns or more, reducing PACKED_MIN_DEPTH or more, of
    PACKED_MIN_FLOP or more (what tori-packed-matmul rewrites)."""
    value = node.meta.get("val")
    if node.target not in (_aten.mm.default, _aten.addmm.default) or not isinstance(value, torch.Tensor):
        return False
    shape, left = tuple(value.shape), _shape(node.args[1] if node.target is _aten.addmm.default else node.args[0])
    return value.dtype == torch.float32 and len(shape) == 2 and all(isinstance(d, int) for d in shape) \
        and left is not None and packable(shape[0], left[-1], shape[1])


_VIEWS = {_aten.view.default, _aten._unsafe_view.default, _aten.expand.default, _aten.reshape.default}


def _packed_exponentials(node: torch.fx.Node) -> bool:
    """Exponentials in tori-packed-attention's form: `exp(s - amax(s))` of float32
    scores [..., M, K], M whole tiles of ATTENTION_LANES rows (at least MIN_ROWS), K at
    least MIN_KEYS, read by a batched matmul."""
    from tori.passes.packed_attention import MIN_KEYS, MIN_ROWS

    shifted = node.args[0]
    if not isinstance(shifted, torch.fx.Node) or shifted.target is not _aten.sub.Tensor:
        return False
    peak = shifted.args[1]
    shape = _shape(node)
    value = node.meta.get("val")
    if not isinstance(peak, torch.fx.Node) or peak.target is not _aten.amax.default or shape is None \
            or len(shape) < 3 or value.dtype != torch.float32:
        return False
    rows, keys = shape[-2:]
    return rows % ATTENTION_LANES == 0 and rows >= MIN_ROWS and keys >= MIN_KEYS and _read_by_matmul(node)


def _read_by_matmul(node: torch.fx.Node) -> bool:
    """Whether a batched matmul reads `node` (through views) as its left operand."""
    for user in node.users:
        if user.target is _aten.bmm.default and user.args[0] is node:
            return True
        if user.target in _VIEWS and _read_by_matmul(user):
            return True
    return False


def _family(node: torch.fx.Node) -> Family | None:
    """The op family of one node of a functional ATen graph, None for other ops."""
    if node.op != "call_function":
        return None
    if node.target is _aten.convolution.default:
        return _conv_family(node)
    if node.target in MATMUL_OPS:
        return Family.NARROW_BATCH_MATMUL if _narrow(node) else Family.WIDE_MATMUL if _wide(node) \
            else Family.FLOAT_MATMUL if _packable(node) else Family.MATMUL
    if node.target is _aten.exp.default and _packed_exponentials(node):
        return Family.ATTENTION
    return None


def _family_ops(graphs: torch.fx.GraphModule | Iterable[torch.fx.GraphModule]) -> dict[Family, list[torch.fx.Node]]:
    """The ops of each family in functional ATen graphs, in order."""
    found: dict[Family, list[torch.fx.Node]] = {}
    graphs = [graphs] if isinstance(graphs, torch.fx.GraphModule) else list(graphs)
    for node in (n for gm in graphs for n in gm.graph.nodes):
        family = _family(node)
        if family is not None:
            found.setdefault(family, []).append(node)
    return found


def op_families(graphs: torch.fx.GraphModule | Iterable[torch.fx.GraphModule]) -> tuple[FamilyUse, ...]:
    """The op families in functional ATen graphs (compiled into one module), with their
    op counts and work."""
    return _uses(_family_ops(graphs))


def _uses(found: dict[Family, list[torch.fx.Node]]) -> tuple[FamilyUse, ...]:
    return tuple(FamilyUse(f, len(found[f]), sum(_flops(n) for n in found[f]) / 1e9) for f in Family if f in found)


def _flag_name(flag: str) -> str:
    return flag.split("=", 1)[0]


def _cpu_has(options: Options, rule: Rule) -> bool:
    """Whether the CPU compiled for (`options.cpu`) has one of the rule's required features."""
    if not rule.cpu_features:
        return True
    from tori.targets.cpu import cpu_features

    return bool(cpu_features(options.cpu) & set(rule.cpu_features))


def direct_convolutions(options: Options) -> bool:
    """Whether a graph compiled with `options` runs its convolutions on IREE's direct
    channels-last kernels (where the convolution rule applies): a CPU target with
    AVX-512 among its targets, and no preprocessing pipeline of the user's own (which
    replaces the rule's)."""
    rule = next(r for r in RULES if r.family is Family.CONV2D)
    if PREPROCESSING_FLAG in {_flag_name(f) for f in options.iree_flags}:
        return False
    return options.codegen is not Codegen.NONE and Target.CPU in (options.target, *options.targets) \
        and _cpu_has(options, rule)


def convolution_rule_applies(options: Options, gflop: float) -> bool:
    """Whether a graph with `gflop` of 2-D convolutions per call, compiled with
    `options`, gets the convolution rule: IREE's direct channels-last kernels
    (`direct_convolutions`) above the rule's floor."""
    rule = next(r for r in RULES if r.family is Family.CONV2D)
    return direct_convolutions(options) and gflop >= rule.min_gflop


# The float32 lanes of the CPUs tori packs attention for (tori-packed-attention): AVX-512's.
ATTENTION_LANES = 16


def packed_attention_lanes(options: Options) -> int:
    """The query rows of tori's packed attention tiles for a graph compiled with
    `options` (ATTENTION_LANES where every target is a CPU with AVX-512), else 0."""
    from tori.targets.build import compiled_targets, cpu_only
    from tori.targets.cpu import cpu_features

    if options.codegen is Codegen.NONE or not cpu_only(compiled_targets(options)):
        return 0
    return ATTENTION_LANES if "+avx512f" in cpu_features(options.cpu) else 0


# A rule's shaped tuning applies where the ops it configures do at least this share of
# its family's work: the tuning spec puts IREE's configuration phase on one thread
# (targets/iree_compile.py). RegNetY-1.6GF at 8 images, whose stem alone took the direct
# convolutions' tile (a few percent of its convolutions' work): no faster (232.9 against
# 233.9 ms, one process, calls alternating), iree-compile 26.1-26.5 -> 29.0-31.3 s.
SHAPED_TUNING_MIN_SHARE = 0.5


def _shaped_tuning(rule: Rule, nodes: list[torch.fx.Node]) -> list[str]:
    """The rule's tuning matchers for its family's ops, or none where the ops they
    configure do less than SHAPED_TUNING_MIN_SHARE of the family's work."""
    matched = [(rule.shaped_tuning(n), _flops(n)) for n in nodes]
    tuned = sum(flop for matcher, flop in matched if matcher)
    if tuned == 0 or tuned < SHAPED_TUNING_MIN_SHARE * sum(flop for _, flop in matched):
        return []
    return [matcher for matcher, _ in matched if matcher]


def choose(graphs: torch.fx.GraphModule | Iterable[torch.fx.GraphModule], options: Options,
           targets: tuple[Target, ...]) -> Strategy:
    """The strategy for the module of `graphs` compiled for `targets` with `options`."""
    ops = _family_ops(graphs)
    uses = _uses(ops)
    if options.codegen is Codegen.NONE or not uses:
        return Strategy(uses)
    work = {u.family: u.gflop for u in uses}
    chosen_rules: dict[tuple[Family, Target], Rule] = {}
    user_flags = {_flag_name(f) for f in options.iree_flags}
    for rule in RULES:
        if (rule.family, rule.target) in chosen_rules or rule.target not in targets:
            continue
        if rule.packed_tile and _UKERNELS in user_flags:
            continue  # the user's microkernels would take tori's tiles: IREE's data tiling instead
        if rule.family in work and work[rule.family] >= rule.min_gflop and _cpu_has(options, rule):
            chosen_rules[(rule.family, rule.target)] = rule
    rules = tuple(chosen_rules.values())
    flags: dict[Target, tuple[str, ...]] = {}
    for target in targets:
        mine = [r for r in rules if r.target is target]
        passes = list(dict.fromkeys(p for r in mine for p in r.preprocessing))
        chosen = list(dict.fromkeys(f for r in mine for f in r.flags))
        if passes:
            chosen.insert(0, f"{PREPROCESSING_FLAG}=builtin.module(util.func({', '.join(passes)}))")
        kernels = tuple(k for r in mine for k in r.kernels)
        if kernels:
            chosen.append(f"{SPEC_FLAG}={spec_path(kernels)}")
        shaped = (t for r in mine if r.shaped_tuning for t in _shaped_tuning(r, ops.get(r.family, [])))
        tuning = tuple(dict.fromkeys((*(t for r in mine for t in r.tuning), *shaped)))
        if tuning:
            chosen.append(f"{TUNING_SPEC_FLAG}={tuning_spec_path(tuning)}")
        chosen = [f for f in chosen if _flag_name(f) not in user_flags]
        if chosen:
            flags[target] = tuple(chosen)
    return Strategy(uses, rules, flags)
