"""Kernel configurations tori gives IREE's CPU code generation for ops whose default
lowering it beats, as a transform-dialect spec generated here and run by IREE's
preprocessing (`--iree-preprocessing-transform-spec-filename`).

Each configuration matches one kind of linalg op and annotates it with a
`compilation_info` (its tile sizes and pipeline). IREE then lowers the op with those
tiles, and its data tiling leaves the op alone (IREE sets no encoding on an op with a
preset strategy).

Narrow batched matmuls, with NARROW_ROWS rows per batch, are the attention of a
decoding step: the few query rows of each key/value head against the whole cache. (A
grouped convolution's taps with 1, 2 or 4 output channels per group also have that
form, its columns an input packed per call like a cache.)
With data tiling, IREE re-packed both caches into its tiled layout on every call, a
copy of the cache per layer: in the static-cache step of a 4-layer Llama with 2048
cached positions those copies took 1.97 of its 6.26 ms of dispatches. Without data
tiling IREE's default tiles read the cache at 7-15 GB/s. Two layouts:

- `dot`: the right operand transposed, the keys read along their rows (q @ k^T);
  the dot products of 8 keys run 64 elements (a head) at a time;
- `axpy`: the right operand as stored, the values read row by row (p @ v); each row
  of the cache updates 64 outputs at once.

The spec is written once per content into tori's temporary folder; its name carries
its hash, so that the compile cache's key (which holds the flags) changes with it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SPEC_FLAG = "--iree-preprocessing-transform-spec-filename"
# IREE's tuning specs run where its code generation configures each dispatch, after
# its fusions and reshapes have rebuilt the ops (and dropped any `compilation_info`
# given earlier): they match an op by its structure and give it a configuration.
TUNING_SPEC_FLAG = "--iree-codegen-tuning-spec-path"


@dataclass(frozen=True)
class KernelConfig:
    """IREE CPU tile sizes for one kind of op: per loop (batch, rows, columns, reduction)
    of a batched matmul, the workgroup's tile, the vector tile and the reduction step."""

    name: str
    matcher: str  # the named sequence that matches the op
    matchers: tuple[str, ...]  # the sources of the named sequences it needs, itself included
    distribution: tuple[int, ...]
    vector: tuple[int, ...]
    reduction: tuple[int, ...]

    def compilation_info(self) -> str:
        return cpu_compilation_info(self.distribution, self.vector, self.reduction)


def cpu_compilation_info(distribution, vector, reduction, pipeline: str = "DoubleTilingExpert") -> str:
    """IREE's `compilation_info` attribute for one CPU op: its workgroup tile, vector
    tile and reduction step per loop, lowered by IREE's `pipeline`."""
    def ints(values):
        return ", ".join(str(v) for v in values)

    return ("#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
            f"distribution = [{ints(distribution)}], vector_common_parallel = [{ints(vector)}], "
            f"vector_reduction = [{ints(reduction)}]>, translation_info = "
            f"#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<{pipeline}>>>")


# The rows per batch of the batched matmuls that get the narrow configurations: a
# decoding step's query rows per key/value head (1 without shared heads, 2 and 4 for
# 8 query heads on 4 and 2 key/value heads), the ones measured.
NARROW_ROWS = (1, 2, 4)


def _rows(rows: int) -> str:
    """@rows{N}: a linalg.batch_matmul with N rows per batch."""
    return f"""
  transform.named_sequence @rows{rows}(%op: !transform.any_op {{transform.readonly}}) -> !transform.any_op {{
    transform.match.operation_name %op ["linalg.batch_matmul"] : !transform.any_op
    %rows = transform.match.structured %op : (!transform.any_op) -> !transform.param<i64> {{
    ^bb0(%s: !transform.any_op):
      %d = transform.match.structured.dim %s[1] : (!transform.any_op) -> !transform.param<i64>
      transform.match.structured.yield %d : !transform.param<i64>
    }}
    %want = transform.param.constant {rows} : i64 -> !transform.param<i64>
    transform.match.param.cmpi eq %rows, %want : !transform.param<i64>
    transform.yield %op : !transform.any_op
  }}"""


def _rows_transposed(rows: int) -> str:
    """@rows{N}_transposed: one whose right operand is a transpose (keys read along their rows)."""
    return f"""
  transform.named_sequence @rows{rows}_transposed(%op: !transform.any_op {{transform.readonly}}) -> !transform.any_op {{
    %narrow = transform.include @rows{rows} failures(propagate) (%op) : (!transform.any_op) -> !transform.any_op
    %rhs = transform.get_producer_of_operand %op[1] : (!transform.any_op) -> !transform.any_op
    transform.match.operation_name %rhs ["linalg.transpose"] : !transform.any_op
    transform.yield %op : !transform.any_op
  }}"""


def _narrow_configs(rows: int) -> tuple[KernelConfig, ...]:
    # A workgroup takes all the rows and 64 columns; the vector tile takes two rows
    # where there are two or more. The dot products take 8 keys and a head of 64 at a
    # time: in the decoding step with 2048 cached positions (2 rows a batch), its four
    # q @ k^T took 386-723 us a call against 572-961 with 4 keys and 16 of the head
    # (profiles alternating, 2026-12-06; 4 keys by 64: 471-519, 16 by 64: 792-914,
    # 4 by 32: 816-884, 2 by 64: 675-759).
    both = min(rows, 2)
    return (KernelConfig(f"dot{rows}", f"rows{rows}_transposed", (_rows(rows), _rows_transposed(rows)),
                         distribution=(1, rows, 64, 0), vector=(1, both, 8, 0), reduction=(0, 0, 0, 64)),
            KernelConfig(f"axpy{rows}", f"rows{rows}", (_rows(rows),),
                         distribution=(1, rows, 64, 0), vector=(1, both, 64, 0), reduction=(0, 0, 0, 4)))


# In match order: an op takes the first configuration whose matcher accepts it.
NARROW_BATCH_MATMUL = tuple(c for rows in NARROW_ROWS for c in _narrow_configs(rows))


def spec_text(configs: tuple[KernelConfig, ...]) -> str:
    """The transform-dialect module that annotates the ops `configs` match."""
    actions = "".join(f"""
  transform.named_sequence @{c.name}(%op: !transform.any_op {{transform.readonly}}) {{
    %info = transform.param.constant {c.compilation_info()} -> !transform.any_param
    transform.annotate %op "compilation_info" = %info : !transform.any_op, !transform.any_param
    transform.yield
  }}""" for c in configs)
    matchers = "".join(dict.fromkeys(m for c in configs for m in c.matchers))
    pairs = ", ".join(f"@{c.matcher} -> @{c.name}" for c in configs)
    return f"""module attributes {{transform.with_named_sequence}} {{{matchers}{actions}
  transform.named_sequence @__transform_main(%module: !transform.any_op {{transform.consumed}}) {{
    %done = transform.foreach_match in %module {pairs} : (!transform.any_op) -> !transform.any_op
    transform.yield
  }}
}}
"""


def spec_path(configs: tuple[KernelConfig, ...]) -> Path:
    """The spec of `configs` as a file (written once, atomically, under tori's temporary
    folder), for iree-compile's SPEC_FLAG."""
    return _written(spec_text(configs), "spec")


# tori-packed-attention's exponentials, as IREE's dispatch holds them: [rows, K, L]
# from scores [rows, L, K] less each row's maximum [rows, L]. One tile of rows a
# workgroup, vector tiles of 16 queries by 16 keys (read along the keys, stored along
# the queries: a transpose in registers); IREE's own vectorizes along the stored
# queries and loads the keys one scalar at a time.
PACKED_EXPONENTIALS = """
  transform.named_sequence @packed_exponentials(%op: !transform.any_op {transform.readonly})
      -> (!transform.any_op, !transform.any_param) {
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {
    ^bb0(%s: tensor<?x?x?xf32>, %m: tensor<?x?xf32>, %e: tensor<?x?x?xf32>):
      %0 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2) -> (d0, d2, d1)>,
                                            affine_map<(d0, d1, d2) -> (d0, d2)>,
                                            affine_map<(d0, d1, d2) -> (d0, d1, d2)>],
                           iterator_types = ["parallel", "parallel", "parallel"]}
          ins(%s, %m : tensor<?x?x?xf32>, tensor<?x?xf32>) outs(%e : tensor<?x?x?xf32>) {
      ^bb0(%x: f32, %p: f32, %o: f32):
        %1 = arith.subf %x, %p : f32
        %2 = math.exp %1 : f32
        linalg.yield %2 : f32
      } -> tensor<?x?x?xf32>
    } : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %info = transform.param.constant """ + cpu_compilation_info((1, 0, 0), (1, 16, 16), (0, 0, 0)) + """
      -> !transform.any_param
    transform.yield %op, %info : !transform.any_op, !transform.any_param
  }"""


# IREE's direct channels-last convolutions (after its conversion to channels last, a
# linalg.generic over [N, OH, OW, OC] reducing over the kernel's [KH, KW, C]) in a
# vector tile of 14 output columns by 32 output channels (28 of AVX-512's 32 registers
# accumulate, as in tori's packed matmuls), one input channel a step, workgroups of 7
# output rows by 56 columns by 64 channels. IREE's own tile, 7 or 8 columns by 16
# channels over steps of 8 input channels, loads a vector of weights per 7 or 8 FMAs.
# ResNet-18's 3x3 convolutions at 8 images (`iree-profile`): 64 channels at 56x56
# 14.4-14.7 -> 8.9-9.3 ms, 128 at 28x28 15.3-15.6 -> 9.2-9.5, its 7x7 stem 14.3 -> 8.6.
# Only convolutions whose output columns and channels are whole tiles: 24 channels (a
# RegNet group's) took 56.8 ms in it at 56x56 against IREE's 2.9 (docs/performance.md).
DIRECT_CONV_TILE = (14, 32)
_DIRECT_CONV_WORKGROUP = (7, 56, 64)


def direct_convolution(stride: int, columns: int, channels: int) -> str:
    """The tuning matcher of IREE's direct convolutions of `stride` (both dims),
    `columns` output columns and `channels` output channels, any kernel and batch
    (DIRECT_CONV_TILE must divide columns and channels)."""
    step = "" if stride == 1 else f" * {stride}"
    maps = (f"affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1{step} + d4, d2{step} + d5, d6)>, "
            "affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d4, d5, d6, d3)>, "
            "affine_map<(d0, d1, d2, d3, d4, d5, d6) -> (d0, d1, d2, d3)>")
    rows, width, depth = _DIRECT_CONV_WORKGROUP
    info = cpu_compilation_info((1, rows, width, depth, 0, 0, 0), (1, 1, *DIRECT_CONV_TILE, 0, 0, 0),
                                (0, 0, 0, 0, 1, 1, 1), pipeline="ConvTileAndDecomposeExpert")
    image, weight, out = "tensor<?x?x?x?xf32>", f"tensor<?x?x?x{channels}xf32>", f"tensor<?x?x{columns}x{channels}xf32>"
    # IREE's conversion keeps the maps it built the op with as `linalg.memoized_indexing_maps`.
    return f"""
  transform.named_sequence @direct_convolution_s{stride}_{columns}x{channels}(%op: !transform.any_op {{transform.readonly}})
      -> (!transform.any_op, !transform.any_param) {{
    %ins, %outs = transform.iree.match.cast_compatible_dag_from_root %op {{
    ^bb0(%x: {image}, %w: {weight}, %o: {out}):
      %0 = linalg.generic {{indexing_maps = [{maps}],
                           iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]}}
          ins(%x, %w : {image}, {weight}) outs(%o : {out}) attrs = {{linalg.memoized_indexing_maps = [{maps}]}} {{
      ^bb0(%a: f32, %b: f32, %c: f32):
        %1 = arith.mulf %a, %b : f32
        %2 = arith.addf %c, %1 : f32
        linalg.yield %2 : f32
      }} -> {out}
    }} : (!transform.any_op) -> (!transform.any_value, !transform.any_value)
    %info = transform.param.constant {info} -> !transform.any_param
    transform.yield %op, %info : !transform.any_op, !transform.any_param
  }}"""


def _matcher_name(matcher: str) -> str:
    return matcher.split("@", 1)[1].split("(", 1)[0]


def tuning_spec_text(matchers: tuple[str, ...]) -> str:
    """The tuning spec that gives each op one of `matchers` (named sequences that
    yield the op and its `compilation_info`) matches that configuration."""
    pairs = ", ".join(f"@{_matcher_name(m)} -> @apply_config" for m in matchers)
    return f"""module attributes {{transform.with_named_sequence, iree_codegen.tuning_spec_with_default_entrypoint}} {{
  transform.named_sequence @apply_config(%op: !transform.any_op {{transform.readonly}},
                                         %info: !transform.any_param {{transform.readonly}}) {{
    transform.annotate %op "compilation_info" = %info : !transform.any_op, !transform.any_param
    transform.yield
  }}{"".join(matchers)}
  transform.named_sequence @__kernel_config(%variant: !transform.any_op {{transform.consumed}}) -> !transform.any_op
      attributes {{iree_codegen.tuning_spec_entrypoint}} {{
    %done = transform.foreach_match in %variant {pairs} : (!transform.any_op) -> !transform.any_op
    transform.yield %done : !transform.any_op
  }}
}}
"""


def tuning_spec_path(matchers: tuple[str, ...]) -> Path:
    """The tuning spec of `matchers` as a file, for iree-compile's TUNING_SPEC_FLAG."""
    return _written(tuning_spec_text(matchers), "tuning")


def _written(text: str, kind: str) -> Path:
    """`text` as a file named by its hash (written once, atomically, under tori's
    temporary folder), so that the compile cache's key changes with it."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "tori-kernel-configs"
    path = folder / f"{kind}-{digest}.mlir"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{path.name}.{os.getpid()}"
        partial.write_text(text)
        os.replace(partial, path)
    return path
