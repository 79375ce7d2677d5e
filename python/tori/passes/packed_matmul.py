"""tori-packed-matmul: a float32 matmul reaches IREE packed in tori's tiles, as
`linalg.pack`, `linalg.mmt4d` and `linalg.unpack`, instead of a `linalg.matmul` for
IREE's data tiling to pack.

IREE's data tiling packs float32 operands for AVX-512 in 16x16 tiles (16 rows of the
left operand, 16 columns of the right, one step of the reduction): each step loads one
vector of the right operand and broadcasts 16 values of the left, one load per FMA,
which holds its matmuls to 60-75% of eager's rate on a core that issues two FMAs a
cycle. A 14x32 tile holds 28 accumulators (of AVX-512's 32 registers), two vector
loads and 14 broadcasts per 28 FMAs. The kernel alone (2 cores, Intel Xeon, DeiT-small's
MLP at 8 images, 1576x384 by 384x1536): 8.4-8.9 ms in 16x16 tiles, 7.4 in 14x32 or
12x32, 9.0 in 8x32, 9.7 in 6x64; eager 5.6 (docs/performance.md). IREE picks its
vector code for the `linalg.mmt4d` from the tile (`Mmt4dTilingExpert`); its
microkernels know only their own tiles, so a module with these matmuls is compiled
with `--iree-llvmcpu-enable-ukernels=none` (targets/codegen.py).

The right operand is read where it is stored: `mm(x, permute(w, [1, 0]))` of a linear
layer's [N, K] weight packs `w` row-blocks directly. For a resident weight IREE hoists
the pack into the module's initializer. The left operand's pack joins the dispatch
that computes it, the unpack the dispatch that reads the result.

Each mmt4d carries IREE's configuration (`compilation_info`): IREE's pipeline and
vector tiles for it, and tori's workgroups (`PackedMatmul.distribution`), one column
of tiles of the right operand and as many rows of the left as a core's L2 keeps:
BERT at one sequence 48.3 -> 39.2 ms.

A matmul's tile has the CPU's columns and its rows, or up to FEWER_ROWS fewer where
they pad the matmul's rows less (`tile_rows`).

The tile is chosen for the CPU compiled for (`lower_for_iree` from
targets/codegen.py's `packed_matmul_tile`); `rows=0` leaves every matmul to IREE.

Rewrites: `torch.aten.mm` of static float32 [M, K] and [K, N] operands with M at
least PACKED_MIN_ROWS, N at least PACKED_MIN_COLUMNS and the tile's columns, K at least
PACKED_MIN_DEPTH and PACKED_MIN_FLOP of work (`packable`), into a call of a private function
of builtin tensors (one per form), `torch_c` casts around the call.

A matmul reducing over SHALLOW_DEPTH values or fewer (a 1x1 convolution of 16
channels), with SHALLOW_MIN_ROWS rows or more and SHALLOW_COLUMNS columns, is not
packed: it becomes a call of a `linalg.matmul` with tori's tiles, which IREE's data
tiling leaves alone, so that no pack joins the dispatch that computes its left operand
(`ShallowMatmul`).

A matmul whose result leaves the graph as it is (through views only: a language model's
logits) is written in its own layout where a tile divides it (`direct_tile`): a
contraction over the packed operands whose result is [row tiles, rows, column tiles,
columns], the matmul's [M, N] as it lies, so that no unpack copies it. IREE fuses an
unpack into the elementwise op that reads a result, but not into a return: Llama's
logits at 8 sequences (1024 rows onto 32000 columns of 512) took 164-191 ms in 13x32
tiles and 43-47 to unpack; written in their layout in 8x32 tiles 167, nothing after
(`iree-benchmark-module`); Llama's prefill (one process, calls alternating) at 8
sequences 329.7 -> 317.3 ms, at one 50.9 -> 47.7 (docs/performance.md). A tile that
pads the result cannot: its slice back to [M, N] was a copy of the same size.

A chain of matmuls (passes/packed_chains.py: a matmul whose result reaches another's
left operand only through elementwise ops, a transformer's MLP) keeps the result in its
tiles: the first matmul is a contraction over the packed operands into [M / rows,
N / cols, rows, cols] (`tiled_result`), which IREE fuses the elementwise ops into, and
the second transposes each tile into its packed left operand (`tiled_left`).

Never changes: batched matmuls, matmuls of fewer rows (a decoding step's), matmuls
whose left operand a convolution computes (CONVOLUTION_DEPTH) or, elementwise, a matmul
left to IREE's data tiling (DATA_TILED_DEPTH), dynamic shapes, other element types, and
every module when `rows` is 0.

Example (rows=14 cols=32):
    %t = torch.aten.permute %w, [1, 0] : !torch.vtensor<[1536,384],f32> -> !torch.vtensor<[384,1536],f32>
    %y = torch.aten.mm %x, %t : !torch.vtensor<[1576,384],f32>, !torch.vtensor<[384,1536],f32> -> !torch.vtensor<[1576,1536],f32>
becomes
    %y0 = func.call @tori_packed_mm_1576x384x1536_nk_14x32(%x0, %w0)
           : (tensor<1576x384xf32>, tensor<1536x384xf32>) -> tensor<1576x1536xf32>
    func.func private @tori_packed_mm_1576x384x1536_nk_14x32(...) {
      (pack x into [113, 384, 14, 1] and w into [48, 384, 32, 1], linalg.mmt4d, unpack)
    }
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from torch_mlir import ir

from tori.passes.builtin_calls import (builtin_tensor, call_private_function, f32_shape, int_pair, located,
                                      ops_named, owner_named)
from tori.passes.matching import users
from tori.passes.packed_chains import Chain, chain_into, retile
from tori.passes.registry import register_pass
from tori.targets.kernel_configs import cpu_compilation_info

PASS_NAME = "tori-packed-matmul"

# The least rows and columns of a matmul this pass rewrites (targets/codegen.py's
# float32 matmul family holds the same matmuls, `packable`). A decoding step's matmuls
# (a few rows) stay with IREE's narrow tiles. 49 rows (a 7x7 stage at one image) are
# packed: in 16-row tiles IREE ran ResNet-18's 49x4608 by 4608x512 at 84-91 GFLOP/s;
# same-process timings at one image with 32 rows against 64: ResNet-18 27.4-27.6 ->
# 24.6-25.3 ms, ResNet-50 53.3-54.9 -> 49.9-50.2, ConvNeXt-T 54.7-55.3 -> 50.4-51.6
# (RegNetY, EfficientNet, MobileNetV3 unchanged).
PACKED_MIN_ROWS = 32
PACKED_MIN_COLUMNS = 32
# The least reduction: below it the packs and the unpack cost more than the tiles save
# (EfficientNet-B0's first 1x1 convolutions, 12544 pixels of 16 channels onto 96: at
# one image 15.0-15.6 ms with them packed, 14.0-14.3 without).
PACKED_MIN_DEPTH = 64
# The least work of one matmul (2 M N K): below it the pack and unpack dispatches cost
# more than the tiles save (EfficientNet-B0 at one image, its 1x1 convolutions of 196
# pixels, 672 and 112 channels, 29.5 MFLOP: 15.5 ms packed against 14.5, 3.8 against
# 3.1 ms outside the dispatches).
PACKED_MIN_FLOP = 64e6
# A matmul whose left operand a convolution computes through this many ops or fewer (a
# 1x1 convolution after a 3x3 one, frontend/decomp/grouped_conv.py) stays with IREE:
# IREE fused the pack into the convolution's dispatch, whose direct kernel then ran at
# 9-16 GFLOP/s (ResNet-50 at 8 images: 1212 ms against 393).
CONVOLUTION_DEPTH = 6
# A matmul whose left operand a matmul left to IREE's data tiling computes through this
# many elementwise ops and views or fewer, each of the operand's size (a 1x1 convolution
# too small to pack, its BatchNorm, the residual add, the next block's 1x1 convolution),
# stays with IREE too: IREE fused the first one's unpack from its 16x16 tiles and tori's
# pack into 14-row tiles into one dispatch, whose vector (112 rows by 80 columns, 35 KB)
# it refused ("large vector sizes"), and MobileNetV3 at 8 images compiled a second time
# on IREE's other data-tiling path. Same process, calls alternating, without the rule
# then with it (ms a call; s of compile): MobileNetV3 at 8 images 42.6 against 41.2 ms,
# 11.2 and 10.2 s against 6.3; where it compiled either way the rule changed little:
# EfficientNet-B0 at 8 images 78.3, 76.9 against 78.0, 76.9 ms; ResNet-50 48.6 against
# 49.1 at one image, 381.5 against 382.6 at 8; RegNetY-1.6GF at one image 46.8 against
# 46.7.
DATA_TILED_DEPTH = 8
# A tile of up to this many rows fewer than the CPU's where it pads the matmul's rows
# less: 128 rows (a sequence of 128 tokens) in 10 tiles of 13 rows, not 140 rows in 10
# of 14; 197 (ViT's) in 17 of 12, not 15 of 14. Same-process timings at one sequence,
# 14 rows, this rule, 14 rows again: BERT 41.4, 39.2, 40.0 and 40.0, 40.0, 41.5 ms;
# GPT-2 72.7, 71.5, 73.9 and 71.1, 70.9, 71.3 (1-3%: the padded rows' share of the
# work). 12x32 ran DeiT-small's MLP matmul as fast as 14x32 (7.4 ms, above).
FEWER_ROWS = 2
# The bytes of packed left operand one workgroup of a packed matmul reads (its rows of
# tiles times the reduction): half of a 2 MiB L2, so that the rows stay in the core's
# L2 while the workgroup walks one column of tiles of the right operand. IREE's own
# choice, one or two row tiles a workgroup, reads the whole right operand from L3
# again for each: BERT's 128x3072 by 3072x768 (its 4 calls, `tori profile`) took
# 16.6 ms with one row tile a workgroup, 15.2 with 3, 12.3 with 5; all 10 (1.7 MiB)
# overflow the L2.
LEFT_BLOCK_BYTES = 1 << 20
# The least workgroups of a packed matmul reducing less than DEEP_REDUCTION, where its
# rows allow them: fewer, larger workgroups balanced worse on two threads (BERT's
# 128x768 by 768x768 in 24 workgroups of 10 row tiles: 12.5 ms a call of its 16 such
# matmuls, 11.0 in 48 of 5; BERT at one sequence without the least, A-B-A in one
# process: 51.7, 55.3 ms against 51.0, 48.7 and 50.3, 50.1).
MIN_WORKGROUPS = 48
# From this reduction on, a workgroup takes all the row tiles the L2 keeps, however few
# workgroups that leaves: each reads its column of a deep weight once. ResNet-18 at one
# image (six packed shapes, reductions 576 to 4608), A-B-A in one process: 30.0, 29.4
# ms against 33.0, 33.1 and 33.3, 34.1 (its 49x4608 by 4608x512, `tori profile`: 6.8-6.9
# -> 5.1-5.6 ms in 16 workgroups of 4 row tiles instead of 32 of 2); Llama prefill at
# one sequence 48.9, 47.3 against 50.7, 50.1 and 49.0, 49.5.
DEEP_REDUCTION = 1024

# A matmul reducing over at most this many values (one AVX-512 vector of float32: a 1x1
# convolution of 16 channels) is not packed at all: IREE's data tiling packed its left
# operand in the dispatch that computes it, and MobileNetV3's first depthwise
# convolution (16 channels at 112x112, 8 images) took 7.7 ms with that pack, 0.34
# without (`tori profile`). As IREE's linalg.matmul with tori's tiles (SHALLOW_ROWS rows
# a workgroup, vectors of SHALLOW_VECTOR_ROWS rows by all the columns), which IREE's
# data tiling leaves alone, MobileNetV3's 112x112 stage at 8 images took 8.0 ms of
# dispatches against 14.8, the model 51.5-52.7 ms against 57.1-59.3 (alternate calls in
# one process, either order; Intel Xeon with AVX-512, 2026-12-05); at one image no
# change beyond the order's 2-3%.
SHALLOW_DEPTH = 16
# ...with at least this many rows (pixels over the batch)...
SHALLOW_MIN_ROWS = 1024
# ...and one of these column counts: EfficientNet-B0's 16 channels onto 96 at 8 images
# took 7.7 ms in vectors of 32 columns against IREE's 4.2 (the model 4-5% slower),
# and vector tiles of 48 or 96 columns ran 50 ms standalone (100352 rows).
SHALLOW_COLUMNS = (16, 32, 64)
SHALLOW_ROWS = 512
SHALLOW_VECTOR_ROWS = 4

# The rows of a tile that a result written in its layout falls back on where none of
# the CPU's rows (less up to FEWER_ROWS) divides it: 8 divides every batch of 8.
DIRECT_FALLBACK_ROWS = 8
# The ops through which a matmul's result may reach the graph's return and still be
# written in its layout.
_VIEWS = ("torch.aten.view", "torch.aten.reshape", "torch.aten._unsafe_view")


@dataclass(frozen=True)
class PackedMatmul:
    """One form of matmul: the function name and body depend only on it."""

    m: int
    k: int
    n: int
    rows: int          # the tile's rows of the left operand
    cols: int          # the tile's columns of the right operand
    weight_nk: bool    # the right operand given as its [N, K] transpose
    direct: bool = False  # the result written as [M, N] lies (`direct_tile`), not unpacked
    # the left operand given as a chain's packed tiles [M / rows, K / cols, rows, cols]
    # (passes/packed_chains.py), transposed into the left operand's layout
    tiled_left: bool = False
    # the result left in its tiles [M / rows, N / cols, rows, cols] for a chain's
    # elementwise ops, computed by a contraction IREE fuses them into
    tiled_result: bool = False

    @property
    def distribution(self) -> tuple[int, int]:
        """The tiles (rows, columns) one workgroup computes: one column of tiles and as
        many rows as LEFT_BLOCK_BYTES holds, split evenly; a reduction shorter than
        DEEP_REDUCTION in MIN_WORKGROUPS or more workgroups where the rows allow."""
        m1, n1 = -(-self.m // self.rows), -(-self.n // self.cols)
        fit = max(1, LEFT_BLOCK_BYTES // (self.rows * self.k * 4))
        least = MIN_WORKGROUPS if self.k < DEEP_REDUCTION else 1
        blocks = max(-(-m1 // fit), min(m1, -(-least // n1)))
        return -(-m1 // blocks), 1

    def _compilation_info(self) -> str:
        """IREE's configuration of the mmt4d: its own pipeline and vector tiles, with
        `distribution`'s workgroups; of the direct and tiled results' contraction (loops:
        row tiles, column tiles, rows, columns, reduction), the same tiles."""
        rows, cols = self.distribution
        if self.direct or self.tiled_result:
            return cpu_compilation_info((rows, cols, 0, 0, 0), (1, 1, self.rows, self.cols, 0), (0, 0, 0, 0, 1))
        return cpu_compilation_info((rows, cols, 0, 0, 0, 0), (1, 1, 0, self.rows, self.cols, 0), (0, 0, 1, 0, 0, 1),
                                    pipeline="Mmt4dTilingExpert")

    @property
    def name(self) -> str:
        layout = "_nk" if self.weight_nk else ""
        direct = "_direct" if self.direct else ""
        tiles = ("_tiledin" if self.tiled_left else "") + ("_tiledout" if self.tiled_result else "")
        return f"tori_packed_mm_{self.m}x{self.k}x{self.n}{layout}_{self.rows}x{self.cols}{direct}{tiles}"

    def function(self, location: str = "") -> str:
        """The private function's MLIR text; its ops carry `location` (the matmul's,
        printed), so that IREE's dispatches name the torch op they compute."""
        m, k, n, rows, cols = self.m, self.k, self.n, self.rows, self.cols
        m1, n1 = -(-m // rows), -(-n // cols)
        left = builtin_tensor(m1, k // cols, rows, cols) if self.tiled_left else builtin_tensor(m, k)
        result = builtin_tensor(m1, n1, rows, cols) if self.tiled_result else builtin_tensor(m, n)
        right = builtin_tensor(n, k) if self.weight_nk else builtin_tensor(k, n)
        # [N, K] row blocks as they lie; [K, N] column blocks, transposed as packed
        right_dims = "inner_dims_pos = [0, 1]" if self.weight_nk else \
            "outer_dims_perm = [1, 0] inner_dims_pos = [1, 0]"
        packed_left, packed_right, packed_out = builtin_tensor(m1, k, rows, 1), builtin_tensor(n1, k, cols, 1), \
            builtin_tensor(m1, n1, rows, cols)
        ops = [
            f"func.func private @{self.name}(%x: {left}, %w: {right}) -> {result} {{",
            "  %zero = arith.constant 0.0 : f32",
            *(self._left_from_tiles() if self.tiled_left else [
                f"  %a0 = tensor.empty() : {packed_left}",
                f"  %a = linalg.pack %x padding_value(%zero : f32) inner_dims_pos = [0, 1] inner_tiles = [{rows}, 1] "
                f"into %a0 : {builtin_tensor(m, k)} -> {packed_left}"]),
            f"  %b0 = tensor.empty() : {packed_right}",
            f"  %b = linalg.pack %w padding_value(%zero : f32) {right_dims} inner_tiles = [{cols}, 1] "
            f"into %b0 : {right} -> {packed_right}",
        ]
        if self.direct:
            ops += self._contraction(m1, n1, "i, r, j, c", builtin_tensor(m1, rows, n1, cols)) + [
                f"  %y = tensor.collapse_shape %c [[0, 1], [2, 3]] : {builtin_tensor(m1, rows, n1, cols)} "
                f"into {result}"]
        elif self.tiled_result:
            ops += self._contraction(m1, n1, "i, j, r, c", packed_out)
        else:
            ops += [
                f"  %c0 = tensor.empty() : {packed_out}",
                f"  %c1 = linalg.fill ins(%zero : f32) outs(%c0 : {packed_out}) -> {packed_out}",
                f"  %c = linalg.mmt4d {{compilation_info = {self._compilation_info()}}} ins(%a, %b : {packed_left}, {packed_right}) outs(%c1 : {packed_out}) -> {packed_out}",
                f"  %y0 = tensor.empty() : {result}",
                f"  %y = linalg.unpack %c inner_dims_pos = [0, 1] inner_tiles = [{rows}, {cols}] into %y0 "
                f": {packed_out} -> {result}",
            ]
        ops += [f"  return {'%c' if self.tiled_result else '%y'} : {result}", "}"]
        return located(ops, location)

    def _left_from_tiles(self) -> list[str]:
        """%a, the left operand packed [M / rows, K, rows, 1], from the chain's tiles %x
        [M / rows, K / cols, rows, cols]: each tile transposed, its columns in turn."""
        m1, k1, rows, cols = -(-self.m // self.rows), self.k // self.cols, self.rows, self.cols
        tiles, turned = builtin_tensor(m1, k1, rows, cols), builtin_tensor(m1, k1, cols, rows)
        return [
            f"  %xt0 = tensor.empty() : {turned}",
            f"  %xt = linalg.transpose ins(%x : {tiles}) outs(%xt0 : {turned}) permutation = [0, 1, 3, 2]",
            f"  %x3 = tensor.collapse_shape %xt [[0], [1, 2], [3]] : {turned} into {builtin_tensor(m1, self.k, rows)}",
            f"  %a = tensor.expand_shape %x3 [[0], [1], [2, 3]] output_shape [{m1}, {self.k}, {rows}, 1] "
            f": {builtin_tensor(m1, self.k, rows)} into {builtin_tensor(m1, self.k, rows, 1)}",
        ]

    def _contraction(self, m1: int, n1: int, out_dims: str, out: str) -> list[str]:
        """%c, the contraction of the packed operands %a and %b as a `linalg.generic`
        (loops i, j, r, c, k: row tiles, column tiles, rows, columns, reduction) into
        `out` indexed by `out_dims`: IREE fuses the elementwise ops that read it."""
        k, rows, cols = self.k, self.rows, self.cols
        left, right = builtin_tensor(m1, k, rows), builtin_tensor(n1, k, cols)
        maps = ", ".join(f"affine_map<(i, j, r, c, k) -> ({dims})>" for dims in ("i, k, r", "j, k, c", out_dims))
        return [
            f"  %a3 = tensor.collapse_shape %a [[0], [1], [2, 3]] : {builtin_tensor(m1, k, rows, 1)} into {left}",
            f"  %b3 = tensor.collapse_shape %b [[0], [1], [2, 3]] : {builtin_tensor(n1, k, cols, 1)} into {right}",
            f"  %c0 = tensor.empty() : {out}",
            f"  %c1 = linalg.fill ins(%zero : f32) outs(%c0 : {out}) -> {out}",
            f"  %c = linalg.generic {{indexing_maps = [{maps}], iterator_types = [\"parallel\", \"parallel\", "
            f"\"parallel\", \"parallel\", \"reduction\"], compilation_info = {self._compilation_info()}}} "
            f"ins(%a3, %b3 : {left}, {right}) outs(%c1 : {out}) {{",
            "  ^bb0(%p: f32, %q: f32, %acc: f32):",
            "    %t = arith.mulf %p, %q : f32",
            "    %s = arith.addf %acc, %t : f32",
            "    linalg.yield %s : f32",
            f"  }} -> {out}",
        ]


@dataclass(frozen=True)
class ShallowMatmul:
    """A matmul whose reduction is SHALLOW_DEPTH or less: IREE's linalg.matmul with
    tori's tiles, which IREE's data tiling then leaves alone."""

    m: int
    k: int
    n: int

    @property
    def name(self) -> str:
        return f"tori_shallow_mm_{self.m}x{self.k}x{self.n}"

    def function(self, location: str = "") -> str:
        m, k, n = self.m, self.k, self.n
        info = cpu_compilation_info((SHALLOW_ROWS, n, 0), (SHALLOW_VECTOR_ROWS, n, 0), (0, 0, 1))
        ops = [
            f"func.func private @{self.name}(%x: {builtin_tensor(m, k)}, %w: {builtin_tensor(k, n)}) -> {builtin_tensor(m, n)} {{",
            "  %zero = arith.constant 0.0 : f32",
            f"  %c0 = tensor.empty() : {builtin_tensor(m, n)}",
            f"  %c1 = linalg.fill ins(%zero : f32) outs(%c0 : {builtin_tensor(m, n)}) -> {builtin_tensor(m, n)}",
            f"  %c = linalg.matmul {{compilation_info = {info}}} ins(%x, %w : {builtin_tensor(m, k)}, {builtin_tensor(k, n)}) "
            f"outs(%c1 : {builtin_tensor(m, n)}) -> {builtin_tensor(m, n)}",
            f"  return %c : {builtin_tensor(m, n)}",
            "}",
        ]
        return located(ops, location)


def _matmul_dims(op: ir.Operation) -> tuple[int, int, int] | None:
    """(M, K, N) of a `torch.aten.mm` of static float32 [M, K] and [K, N] operands, else None."""
    if op.name != "torch.aten.mm":
        return None
    lhs, rhs, out = (f32_shape(v) for v in (*op.operands, op.results[0]))
    if lhs is None or rhs is None or out is None or len(lhs) != 2 or len(rhs) != 2:
        return None
    (m, k), (k_right, n) = lhs, rhs
    return (m, k, n) if k == k_right and out == [m, n] else None


def shallow_form(op: ir.Operation) -> ShallowMatmul | None:
    """The form of a `torch.aten.mm` reducing over SHALLOW_DEPTH values or fewer, with
    SHALLOW_MIN_ROWS rows or more and SHALLOW_COLUMNS columns, else None."""
    dims = _matmul_dims(op)
    if dims is None:
        return None
    m, k, n = dims
    if k > SHALLOW_DEPTH or m < SHALLOW_MIN_ROWS or n not in SHALLOW_COLUMNS:
        return None
    return ShallowMatmul(m, k, n)


def packable(m: int, k: int, n: int) -> bool:
    """Whether an [m, k] by [k, n] float32 matmul is large enough for tori's packed
    tiles (the least rows, columns, reduction and work above); targets/codegen.py's
    float32 matmul family holds the same matmuls."""
    return m >= PACKED_MIN_ROWS and n >= PACKED_MIN_COLUMNS and k >= PACKED_MIN_DEPTH and 2 * m * n * k >= PACKED_MIN_FLOP


def tile_rows(m: int, rows: int) -> int:
    """The rows of the left operand's tiles for a matmul of `m` rows: `rows`, or up to
    FEWER_ROWS fewer where they pad `m` less."""
    return min(range(max(1, rows - FEWER_ROWS), rows + 1), key=lambda r: (-(-m // r) * r, -r))


def direct_tile(m: int, n: int, rows: int, cols: int) -> int | None:
    """The rows of a tile of `cols` columns that divides an [m, n] result (the CPU's
    `rows`, up to FEWER_ROWS fewer, else DIRECT_FALLBACK_ROWS), else None."""
    if n % cols:
        return None
    return next((r for r in (*range(rows, rows - FEWER_ROWS - 1, -1), DIRECT_FALLBACK_ROWS) if m % r == 0), None)


def _returned(value: ir.Value) -> bool:
    """Whether every use of `value` is the function's return or a view that is."""
    uses = users(value)
    return bool(uses) and all(
        op.name == "func.return" or (op.name in _VIEWS and _returned(op.results[0])) for op in uses)


def _transposed(value: ir.Value) -> ir.Value | None:
    """The [N, K] tensor that `value` is `permute([1, 0])` of, else None."""
    permute = owner_named(value, "torch.aten.permute")
    if permute is None or int_pair(permute.operands[1]) != (1, 0) or f32_shape(permute.operands[0]) is None:
        return None
    return permute.operands[0]


def _computed_by(value: ir.Value, depth: int, source, same_size: bool = False) -> bool:
    """Whether an op that `source` accepts computes `value` through at most `depth` ops
    (elementwise epilogues, views), none of them a matmul, a convolution or a call, and
    with `same_size` each of them as large as `value` (no broadcast operand followed)."""
    owner = getattr(value.owner, "operation", value.owner)
    if not isinstance(owner, ir.Operation):
        return False
    if source(owner):
        return True
    if depth == 0 or owner.name in ("torch.aten.mm", "torch.aten.bmm", "torch.aten.convolution", "func.call"):
        return False
    size = _elements(value) if same_size else None
    return any(_computed_by(v, depth - 1, source, same_size) for v in owner.operands
               if str(v.type).startswith("!torch.vtensor") and (size is None or _elements(v) == size))


def _elements(value: ir.Value) -> int | None:
    shape = f32_shape(value)
    return None if shape is None else math.prod(shape)


def _fed_by_convolution(value: ir.Value) -> bool:
    """Whether a `torch.aten.convolution` (or tori's depthwise one) computes `value`
    (CONVOLUTION_DEPTH)."""
    return _computed_by(value, CONVOLUTION_DEPTH, lambda op: op.name == "torch.aten.convolution" or (
        op.name == "func.call" and str(op.attributes["callee"]).startswith("@tori_depthwise_")))


def _fed_by_data_tiled_matmul(value: ir.Value, rewritten: frozenset[int] = frozenset()) -> bool:
    """Whether a matmul this pass leaves to IREE's data tiling (a `torch.aten.mm` not
    in `rewritten`, the hashes of those the pass rewrites before this one) computes
    `value` elementwise (DATA_TILED_DEPTH)."""
    return _computed_by(value, DATA_TILED_DEPTH, lambda op: op.name == "torch.aten.mm" and hash(op) not in rewritten,
                        same_size=True)


def matmul_form(op: ir.Operation, rows: int, cols: int,
                rewritten: frozenset[int] = frozenset()) -> tuple[PackedMatmul, list[ir.Value]] | None:
    """The form of a `torch.aten.mm` this pass rewrites and the function's operands,
    else None; `rewritten`: the matmuls (hashes) the pass rewrites before this one."""
    dims = _matmul_dims(op) if rows > 0 and cols > 0 else None
    if dims is None:
        return None
    m, k, n = dims
    x, right = op.operands
    if m < rows or n < cols or not packable(m, k, n) or _fed_by_convolution(x) \
            or _fed_by_data_tiled_matmul(x, rewritten):
        return None
    direct_rows = direct_tile(m, n, rows, cols) if _returned(op.results[0]) else None
    form = PackedMatmul(m, k, n, direct_rows or tile_rows(m, rows), cols, weight_nk=_transposed(right) is not None,
                        direct=direct_rows is not None)
    return form, _operands(op)


def _operands(op: ir.Operation) -> list[ir.Value]:
    """A packed matmul function's operands: the left operand, and the right one or the
    [N, K] weight it is the transpose of."""
    x, right = op.operands
    weight = _transposed(right)
    return [x, weight if weight is not None else right]


def planned_forms(matmuls: list[ir.Operation], rows: int, cols: int) -> dict[int, PackedMatmul | ShallowMatmul]:
    """The form of each matmul of `matmuls` (in order) that the pass rewrites, by index:
    packed (`matmul_form`) or shallow (`shallow_form`)."""
    forms, rewritten = {}, set()
    for i, mm in enumerate(matmuls):
        found = matmul_form(mm, rows, cols, frozenset(rewritten))
        form = found[0] if found is not None else (shallow_form(mm) if rows > 0 else None)
        if form is not None:
            forms[i] = form
            rewritten.add(hash(mm))
    return forms


def chain_forms(matmuls: list[ir.Operation], forms: dict[int, PackedMatmul | ShallowMatmul], cols: int) -> list[Chain]:
    """The chains (passes/packed_chains.py) into `matmuls` whose matmuls all have packed
    forms of the same tile rows, N a multiple of `cols`; their forms in `forms` become
    the leaves' with `tiled_result`, the consumers' with `tiled_left`."""
    chains = []
    index = {hash(mm): i for i, mm in enumerate(matmuls)}
    for i, consumer in enumerate(matmuls):
        form = forms.get(i)
        chain = chain_into(consumer) if isinstance(form, PackedMatmul) else None
        if chain is None or chain.n % cols:
            continue
        leaves = [index[hash(leaf)] for leaf in chain.leaves]
        if not all(isinstance(forms.get(j), PackedMatmul) and not forms[j].direct and forms[j].rows == form.rows
                   for j in leaves):
            continue
        chains.append(chain)
        for j in leaves:
            forms[j] = replace(forms[j], tiled_result=True)
        forms[i] = replace(forms[i], tiled_left=True)
    return chains


@register_pass(PASS_NAME)
def packed_matmul(op: ir.Operation, pass_: object, *, rows: int = 0, cols: int = 0) -> None:
    """Rewrite each float32 matmul large enough (`packable`) into packed tiles of
    `rows` x `cols`, chains of them (`chain_forms`) keeping their tiles between them,
    and each shallow one (`shallow_form`) into tori's unpacked tiles (`rows=0`: nothing
    changes)."""
    matmuls = ops_named(op, "torch.aten.mm")
    forms = planned_forms(matmuls, rows, cols)
    for chain in chain_forms(matmuls, forms, cols):
        retile(chain, forms[matmuls.index(chain.consumer)].rows, cols)
    for i, mm in enumerate(matmuls):
        if i in forms:
            # operands read as each matmul is replaced: an earlier one's result has gone
            operands = _operands(mm) if isinstance(forms[i], PackedMatmul) else list(mm.operands)
            call_private_function(op, mm, forms[i].name, forms[i].function(str(mm.location)), operands,
                                  [ir.F32Type.get()] * 2)
