"""FileCheck tests of tori-packed-matmul: a float32 matmul of enough rows becomes a call
of a function that packs both operands in tori's tiles, multiplies them with
`linalg.mmt4d` and unpacks the result; a linear layer's [N, K] weight is packed as it
lies. A matmul reducing over 16 values or fewer becomes a `linalg.matmul` with tori's
tiles, unpacked. A result that the function returns (through views) is written in its
own layout where a tile divides it. Matmuls of few rows, other element types, batched matmuls, and modules
without a tile (`rows=0`, the default) are left as they are."""

PIPELINE = "tori-packed-matmul{rows=14 cols=32}"

DIMS = """
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %dims = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>"""


def t(*dims: int, element: str = "f32") -> str:
    return f"!torch.vtensor<[{','.join(map(str, dims))}],{element}>"


def linear(m: int, k: int, n: int, element: str = "f32", returned: bool = False) -> str:
    """`@lin`: mm of an [m, k] matrix and the transpose of an [n, k] weight, its result
    read by a ReLU (or, `returned`, viewed as [1, m, n] and returned)."""
    x, w, wt, out = t(m, k, element=element), t(n, k, element=element), t(k, n, element=element), \
        t(m, n, element=element)
    if returned:
        last = f"""%int{m} = torch.constant.int {m}
          %int{n} = torch.constant.int {n}
          %size = torch.prim.ListConstruct %int1, %int{m}, %int{n} : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %1 = torch.aten.view %0, %size : {out}, !torch.list<int> -> {t(1, m, n, element=element)}"""
        result = t(1, m, n, element=element)
    else:
        last, result = f"%1 = torch.aten.relu %0 : {out} -> {out}", out
    return f"""
        func.func @lin(%arg0: {x}, %arg1: {w}) -> {result} {{
          {DIMS}
          %t = torch.aten.permute %arg1, %dims : {w}, !torch.list<int> -> {wt}
          %0 = torch.aten.mm %arg0, %t : {x}, {wt} -> {out}
          {last}
          return %1 : {result}
        }}
    """


def test_a_linear_layer_packs_its_weight_rows_as_they_lie(filecheck):
    filecheck(linear(1576, 384, 1536), """
        # CHECK-LABEL: func.func @lin
        # CHECK-DAG:     %[[X:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[1576,384],f32>) -> tensor<1576x384xf32>
        # CHECK-DAG:     %[[W:.+]] = "torch_c.to_builtin_tensor"(%arg1) : (!torch.vtensor<[1536,384],f32>) -> tensor<1536x384xf32>
        # CHECK:         %[[R:.+]] = call @tori_packed_mm_1576x384x1536_nk_14x32(%[[X]], %[[W]])
        # CHECK:         "torch_c.from_builtin_tensor"(%[[R]]) : (tensor<1576x1536xf32>) -> !torch.vtensor<[1576,1536],f32>
        # CHECK-NOT:     torch.aten.mm
        # CHECK-LABEL: func.func private @tori_packed_mm_1576x384x1536_nk_14x32
        # CHECK:         %[[A:.+]] = linalg.pack %arg0 padding_value(%{{.+}} : f32) inner_dims_pos = [0, 1] inner_tiles = [14, 1]
        # CHECK-SAME:      : tensor<1576x384xf32> -> tensor<113x384x14x1xf32>
        # CHECK:         %[[B:.+]] = linalg.pack %arg1 padding_value(%{{.+}} : f32) inner_dims_pos = [0, 1] inner_tiles = [32, 1]
        # CHECK-SAME:      : tensor<1536x384xf32> -> tensor<48x384x32x1xf32>
        # CHECK:         %[[C:.+]] = linalg.fill
        # CHECK:         %[[P:.+]] = linalg.mmt4d {compilation_info = #iree_codegen.compilation_info<
        # CHECK-SAME:      lowering_config = #iree_cpu.lowering_config<distribution = [38, 1, 0, 0, 0, 0],
        # CHECK-SAME:      vector_common_parallel = [1, 1, 0, 14, 32, 0], vector_reduction = [0, 0, 1, 0, 0, 1]>
        # CHECK-SAME:      translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<Mmt4dTilingExpert>>
        # CHECK-SAME:      ins(%[[A]], %[[B]] : tensor<113x384x14x1xf32>, tensor<48x384x32x1xf32>)
        # CHECK-SAME:      outs(%[[C]] : tensor<113x48x14x32xf32>)
        # CHECK:         linalg.unpack %[[P]] inner_dims_pos = [0, 1] inner_tiles = [14, 32]
        # CHECK-SAME:      : tensor<113x48x14x32xf32> -> tensor<1576x1536xf32>
    """)


def test_a_workgroup_takes_the_row_tiles_the_l2_keeps_in_48_workgroups_unless_the_reduction_is_deep(filecheck):
    # BERT at one sequence: 10 row tiles of 13 (130 rows; 14 would pad to 140). A reduction of 3072 fits 6 of them in
    # LEFT_BLOCK_BYTES (160 KiB each): two workgroups of 5 per column of tiles. A
    # reduction of 768 fits all 10: 96 columns keep them together; 24 columns
    # would give 24 workgroups, so they split in two.
    down = linear(128, 3072, 768).replace("@lin", "@down")
    up = linear(128, 768, 3072).replace("@lin", "@up")
    square = linear(128, 768, 768).replace("@lin", "@square")
    # From a reduction of 1024 (DEEP_REDUCTION) on, the fewest workgroups: a 7x7 stage's
    # 49 rows (4 tiles of 13) by a 4608-deep 512-column weight, all 4 row tiles in each
    # of 16 workgroups.
    deep = linear(49, 4608, 512).replace("@lin", "@deep")
    filecheck(down + up + square + deep, """
        # CHECK-LABEL: func.func private @tori_packed_mm_128x3072x768_nk_13x32
        # CHECK:         linalg.mmt4d {{.+}}distribution = [5, 1, 0, 0, 0, 0]{{.+}} ins({{.+}} : tensor<10x3072x13x1xf32>, tensor<24x3072x32x1xf32>)
        # CHECK-LABEL: func.func private @tori_packed_mm_128x768x3072_nk_13x32
        # CHECK:         linalg.mmt4d {{.+}}distribution = [10, 1, 0, 0, 0, 0]{{.+}} ins({{.+}} : tensor<10x768x13x1xf32>, tensor<96x768x32x1xf32>)
        # CHECK-LABEL: func.func private @tori_packed_mm_128x768x768_nk_13x32
        # CHECK:         linalg.mmt4d {{.+}}distribution = [5, 1, 0, 0, 0, 0]{{.+}} ins({{.+}} : tensor<10x768x13x1xf32>, tensor<24x768x32x1xf32>)
        # CHECK-LABEL: func.func private @tori_packed_mm_49x4608x512_nk_13x32
        # CHECK:         linalg.mmt4d {{.+}}distribution = [4, 1, 0, 0, 0, 0]{{.+}} ins({{.+}} : tensor<4x4608x13x1xf32>, tensor<16x4608x32x1xf32>)
    """)


def test_a_right_operand_of_k_by_n_is_packed_transposed_and_padded(filecheck):
    # 200 rows: 17 tiles of 12 (204 rows) pad less than 15 of 14 (210) or 16 of 13 (208)
    x, w, out = t(200, 480), t(480, 400), t(200, 400)
    filecheck(f"""
        func.func @mm(%arg0: {x}, %arg1: {w}) -> {out} {{
          %0 = torch.aten.mm %arg0, %arg1 : {x}, {w} -> {out}
          return %0 : {out}
        }}
    """, """
        # CHECK-LABEL: func.func @mm
        # CHECK:         call @tori_packed_mm_200x480x400_12x32(
        # CHECK-LABEL: func.func private @tori_packed_mm_200x480x400_12x32
        # CHECK:         linalg.pack %arg0 {{.+}} : tensor<200x480xf32> -> tensor<17x480x12x1xf32>
        # CHECK:         linalg.pack %arg1 padding_value(%{{.+}} : f32) outer_dims_perm = [1, 0] inner_dims_pos = [1, 0] inner_tiles = [32, 1]
        # CHECK-SAME:      : tensor<480x400xf32> -> tensor<13x480x32x1xf32>
        # CHECK:         linalg.mmt4d
        # CHECK:         linalg.unpack {{.+}} : tensor<17x13x12x32xf32> -> tensor<200x400xf32>
    """)


def test_layers_of_one_shape_share_one_function(filecheck):
    x, w, wt = t(512, 256), t(256, 256), t(256, 256)
    output = filecheck(f"""
        func.func @two(%arg0: {x}, %arg1: {w}, %arg2: {w}) -> {x} {{
          {DIMS}
          %t = torch.aten.permute %arg1, %dims : {w}, !torch.list<int> -> {wt}
          %0 = torch.aten.mm %arg0, %t : {x}, {wt} -> {x}
          %u = torch.aten.permute %arg2, %dims : {w}, !torch.list<int> -> {wt}
          %1 = torch.aten.mm %arg0, %u : {x}, {wt} -> {x}
          %int1_0 = torch.constant.int 1
          %2 = torch.aten.add.Tensor %0, %1, %int1_0 : {x}, {x}, !torch.int -> {x}
          return %2 : {x}
        }}
    """, """
        # CHECK-LABEL: func.func @two
        # CHECK:         call @tori_packed_mm_512x256x256_nk_12x32(
        # CHECK:         call @tori_packed_mm_512x256x256_nk_12x32(
        # CHECK-NOT:     torch.aten.mm
    """)
    assert output.count("func.func private @tori_packed_mm_512x256x256_nk_12x32") == 1


def test_a_returned_result_is_written_in_its_layout_where_a_tile_divides_it(filecheck):
    # Llama's logits at 8 sequences: 1024 rows, which none of 14, 13 and 12 divides: 8;
    # 1092 rows (78 tiles of 14) keep the CPU's 14.
    logits = linear(1024, 512, 32000, returned=True).replace("@lin", "@logits")
    fourteen = linear(1092, 512, 32000, returned=True).replace("@lin", "@fourteen")
    filecheck(logits + fourteen, """
        # CHECK-LABEL: func.func @logits
        # CHECK:         %[[R:.+]] = call @tori_packed_mm_1024x512x32000_nk_8x32_direct(
        # CHECK:         %[[T:.+]] = "torch_c.from_builtin_tensor"(%[[R]]) : (tensor<1024x32000xf32>)
        # CHECK:         torch.aten.view %[[T]]
        # CHECK-LABEL: func.func @fourteen
        # CHECK:         call @tori_packed_mm_1092x512x32000_nk_14x32_direct(
        # CHECK-LABEL: func.func private @tori_packed_mm_1024x512x32000_nk_8x32_direct
        # CHECK:         %[[A:.+]] = linalg.pack %arg0 {{.+}} inner_tiles = [8, 1] {{.+}} -> tensor<128x512x8x1xf32>
        # CHECK:         %[[B:.+]] = linalg.pack %arg1 {{.+}} inner_tiles = [32, 1] {{.+}} -> tensor<1000x512x32x1xf32>
        # CHECK:         %[[A3:.+]] = tensor.collapse_shape %[[A]] {{\[}}[0], [1], [2, 3]] : tensor<128x512x8x1xf32> into tensor<128x512x8xf32>
        # CHECK:         %[[B3:.+]] = tensor.collapse_shape %[[B]] {{\[}}[0], [1], [2, 3]] : tensor<1000x512x32x1xf32> into tensor<1000x512x32xf32>
        # CHECK:         %[[C:.+]] = linalg.fill
        # CHECK:         %[[P:.+]] = linalg.generic {indexing_maps = [#{{[a-z0-9]+}}, #{{[a-z0-9]+}}, #{{[a-z0-9]+}}],
        # CHECK-SAME:      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]
        # CHECK-SAME:      ins(%[[A3]], %[[B3]] : tensor<128x512x8xf32>, tensor<1000x512x32xf32>) outs(%[[C]] : tensor<128x8x1000x32xf32>)
        # CHECK-SAME:      distribution = [64, 1, 0, 0, 0], vector_common_parallel = [1, 1, 8, 32, 0], vector_reduction = [0, 0, 0, 0, 1]
        # CHECK-SAME:      pipeline = #iree_cpu.pipeline<DoubleTilingExpert>
        # CHECK:         arith.mulf
        # CHECK:         arith.addf
        # CHECK:         %[[Y:.+]] = tensor.collapse_shape %[[P]] {{\[}}[0, 1], [2, 3]] : tensor<128x8x1000x32xf32> into tensor<1024x32000xf32>
        # CHECK-NOT:     linalg.unpack
        # CHECK:         return %[[Y]]
        # CHECK-LABEL: func.func private @tori_packed_mm_1092x512x32000_nk_14x32_direct
        # CHECK:         linalg.generic {{.+}} outs(%{{.+}} : tensor<78x14x1000x32xf32>)
    """)


def test_a_returned_result_that_no_tile_divides_or_that_an_op_also_reads_is_unpacked(filecheck):
    # GPT-2's 50257 columns; a result returned and also read by a ReLU.
    gpt2 = linear(1024, 768, 50257, returned=True).replace("@lin", "@gpt2")
    x, w, out = t(1024, 512), t(512, 512), t(1024, 512)
    filecheck(gpt2 + f"""
        func.func @both(%arg0: {x}, %arg1: {w}) -> ({out}, {out}) {{
          %0 = torch.aten.mm %arg0, %arg1 : {x}, {w} -> {out}
          %1 = torch.aten.relu %0 : {out} -> {out}
          return %0, %1 : {out}, {out}
        }}
    """, """
        # CHECK-LABEL: func.func @gpt2
        # CHECK:         call @tori_packed_mm_1024x768x50257_nk_13x32(
        # CHECK-LABEL: func.func @both
        # CHECK:         call @tori_packed_mm_1024x512x512_13x32(
        # CHECK-LABEL: func.func private @tori_packed_mm_1024x768x50257_nk_13x32
        # CHECK:         linalg.mmt4d
        # CHECK:         linalg.unpack
        # CHECK-NOT:     _direct
    """)


def test_few_rows_other_types_and_batched_matmuls_are_left_alone(filecheck):
    few, ints = linear(31, 1024, 1024), linear(512, 256, 256, element="si32")
    b, bo = t(4, 128, 64), t(4, 128, 128)
    filecheck(few + ints.replace("@lin", "@ints") + f"""
        func.func @bmm(%arg0: {b}, %arg1: !torch.vtensor<[4,64,128],f32>) -> {bo} {{
          %0 = torch.aten.bmm %arg0, %arg1 : {b}, !torch.vtensor<[4,64,128],f32> -> {bo}
          return %0 : {bo}
        }}
    """, """
        # CHECK-LABEL: func.func @lin
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @ints
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @bmm
        # CHECK:         torch.aten.bmm
        # CHECK-NOT:     tori_packed_mm
    """)


def test_narrow_columns_shallow_or_small_products_and_dynamic_rows_are_left_alone(filecheck):
    # 31 columns (short of a tile), a reduction of 63 (EfficientNet's first 1x1
    # convolutions: the packs cost more than they save), 2 M N K under 64 MFLOP.
    x, w, out = t(4096, 256), t(256, 31), t(4096, 31)
    shallow = linear(4096, 63, 512).replace("@lin", "@shallow")
    small = linear(256, 256, 256).replace("@lin", "@small")
    dx, dout = "!torch.vtensor<[?,64],f32>", "!torch.vtensor<[?,64],f32>"
    filecheck(f"""
        func.func @narrow(%arg0: {x}, %arg1: {w}) -> {out} {{
          %0 = torch.aten.mm %arg0, %arg1 : {x}, {w} -> {out}
          return %0 : {out}
        }}
        func.func @dynamic(%arg0: {dx}, %arg1: !torch.vtensor<[64,64],f32>) -> {dout} {{
          %0 = torch.aten.mm %arg0, %arg1 : {dx}, !torch.vtensor<[64,64],f32> -> {dout}
          return %0 : {dout}
        }}
    """ + shallow + small, """
        # CHECK-LABEL: func.func @narrow
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @dynamic
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @shallow
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @small
        # CHECK:         torch.aten.mm
        # CHECK-NOT:     tori_packed_mm
    """)


def shallow(m: int, k: int, n: int, name: str) -> str:
    """`@name`: mm of an [m, k] matrix (a 1x1 convolution's pixels) and a [k, n] weight."""
    x, w, out = t(m, k), t(k, n), t(m, n)
    return f"""
        func.func @{name}(%arg0: {x}, %arg1: {w}) -> {out} {{
          %0 = torch.aten.mm %arg0, %arg1 : {x}, {w} -> {out}
          return %0 : {out}
        }}
    """


def test_a_shallow_matmul_keeps_its_operands_as_stored_with_tori_tiles(filecheck):
    # MobileNetV3's first 1x1 convolutions at 8 images: 100352 pixels of 16 channels.
    filecheck(shallow(100352, 16, 16, "same") + shallow(100352, 16, 64, "wide"), """
        # CHECK-LABEL: func.func @same
        # CHECK:         call @tori_shallow_mm_100352x16x16(%{{[0-9]+}}, %{{[0-9]+}})
        # CHECK-SAME:      : (tensor<100352x16xf32>, tensor<16x16xf32>) -> tensor<100352x16xf32>
        # CHECK-NOT:     torch.aten.mm
        # CHECK-LABEL: func.func @wide
        # CHECK:         call @tori_shallow_mm_100352x16x64
        # CHECK-LABEL: func.func private @tori_shallow_mm_100352x16x16
        # CHECK-NOT:     linalg.pack
        # CHECK:         linalg.matmul {compilation_info = #iree_codegen.compilation_info<
        # CHECK-SAME:      lowering_config = #iree_cpu.lowering_config<distribution = [512, 16, 0],
        # CHECK-SAME:      vector_common_parallel = [4, 16, 0], vector_reduction = [0, 0, 1]>
        # CHECK-SAME:      pipeline = #iree_cpu.pipeline<DoubleTilingExpert>
        # CHECK-SAME:      ins(%arg0, %arg1 : tensor<100352x16xf32>, tensor<16x16xf32>)
        # CHECK-LABEL: func.func private @tori_shallow_mm_100352x16x64
        # CHECK:         linalg.matmul {{.+}}distribution = [512, 64, 0], vector_common_parallel = [4, 64, 0]
    """)


def test_shallow_matmuls_of_other_columns_few_rows_or_17_deep_are_left_to_iree(filecheck):
    # 96 columns (EfficientNet-B0's 16 channels onto 96: IREE's own tiles were faster),
    # 1023 rows, a reduction of 17.
    filecheck(shallow(100352, 16, 96, "other") + shallow(1023, 16, 16, "few") + shallow(4096, 17, 64, "deeper"), """
        # CHECK-LABEL: func.func @other
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @few
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @deeper
        # CHECK:         torch.aten.mm
        # CHECK-NOT:     tori_shallow_mm
    """)


def test_without_a_tile_nothing_changes(filecheck):
    filecheck(linear(1576, 384, 1536) + shallow(100352, 16, 16, "shallow"), """
        # CHECK-LABEL: func.func @lin
        # CHECK:         torch.aten.mm
        # CHECK-LABEL: func.func @shallow
        # CHECK:         torch.aten.mm
        # CHECK-NOT:     tori_
    """, pipeline="tori-packed-matmul")


def test_a_matmul_after_a_convolution_is_left_to_iree(filecheck):
    # ResNet's 1x1 convolution after its 3x3 one, as frontend/decomp/grouped_conv.py
    # writes it: IREE fused the pack into the convolution's dispatch, which then crawled.
    x, w, c, o = t(8, 256, 8, 8), t(256, 256, 3, 3), t(8, 256, 8, 8), t(8, 8, 8, 256)
    filecheck(f"""
        func.func @conv_then_mm(%arg0: {x}, %arg1: {w}, %arg2: {t(256, 256)}, %arg3: {t(512, 256)}) -> {t(512, 256)} {{
          %none = torch.constant.none
          %false = torch.constant.bool false
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %int2 = torch.constant.int 2
          %int3 = torch.constant.int 3
          %int512 = torch.constant.int 512
          %int256 = torch.constant.int 256
          %ones = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
          %zeros = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
          %0 = torch.aten.convolution %arg0, %arg1, %none, %ones, %ones, %ones, %false, %zeros, %int1 : {x}, {w}, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> {c}
          %1 = torch.aten.relu %0 : {c} -> {c}
          %perm = torch.prim.ListConstruct %int0, %int2, %int3, %int1 : (!torch.int, !torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %2 = torch.aten.permute %1, %perm : {c}, !torch.list<int> -> {o}
          %size = torch.prim.ListConstruct %int512, %int256 : (!torch.int, !torch.int) -> !torch.list<int>
          %3 = torch.aten.view %2, %size : {o}, !torch.list<int> -> {t(512, 256)}
          %4 = torch.aten.mm %3, %arg2 : {t(512, 256)}, {t(256, 256)} -> {t(512, 256)}
          %5 = torch.aten.mm %arg3, %arg2 : {t(512, 256)}, {t(256, 256)} -> {t(512, 256)}
          %6 = torch.aten.add.Tensor %4, %5, %int1 : {t(512, 256)}, {t(512, 256)}, !torch.int -> {t(512, 256)}
          return %6 : {t(512, 256)}
        }}
    """, """
        # CHECK-LABEL: func.func @conv_then_mm
        # CHECK:         torch.aten.convolution
        # CHECK:         torch.aten.mm %{{.+}}, %arg2
        # CHECK:         "torch_c.to_builtin_tensor"(%arg3)
        # CHECK:         call @tori_packed_mm_512x256x256_12x32(
    """)


def residual_block(first: int, broadcast_only: bool) -> str:
    """`@block`: a 1x1 convolution's matmul of 1568 pixels from `first` channels onto
    80, its BatchNorm (a scale and shift of 80 values), the residual add and a ReLU,
    then the next block's matmul onto 480 channels; `broadcast_only`: the first matmul
    reaches the second only as a per-channel scale (a squeeze-excitation gate)."""
    x, w1, h, w2, out, c = t(1568, first), t(first, 80), t(1568, 80), t(80, 480), t(1568, 480), t(80)
    gate = t(8, 80)
    if broadcast_only:
        first_mm = f"""%m = torch.aten.mm %g, %w1 : {t(8, first)}, {w1} -> {gate}
          %s = torch.aten.sigmoid %m : {gate} -> {gate}
          %s0 = torch.aten.view %s, %s_size : {gate}, !torch.list<int> -> {t(8, 1, 80)}
          %x3 = torch.aten.view %x1, %x_size : {h}, !torch.list<int> -> {t(8, 196, 80)}
          %gated = torch.aten.mul.Tensor %x3, %s0 : {t(8, 196, 80)}, {t(8, 1, 80)} -> {t(8, 196, 80)}
          %0 = torch.aten.view %gated, %flat : {t(8, 196, 80)}, !torch.list<int> -> {h}"""
        inputs = f"%g: {t(8, first)}, %x1: {h}"
    else:
        first_mm = f"%0 = torch.aten.mm %x, %w1 : {x}, {w1} -> {h}"
        inputs = f"%x: {x}, %x1: {h}"
    return f"""
        func.func @block({inputs}, %w1: {w1}, %scale: {c}, %shift: {c}, %w2: {w2}) -> {out} {{
          %int1 = torch.constant.int 1
          %int8 = torch.constant.int 8
          %int80 = torch.constant.int 80
          %int196 = torch.constant.int 196
          %int1568 = torch.constant.int 1568
          %s_size = torch.prim.ListConstruct %int8, %int1, %int80 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %x_size = torch.prim.ListConstruct %int8, %int196, %int80 : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %flat = torch.prim.ListConstruct %int1568, %int80 : (!torch.int, !torch.int) -> !torch.list<int>
          {first_mm}
          %1 = torch.aten.mul.Tensor %0, %scale : {h}, {c} -> {h}
          %2 = torch.aten.add.Tensor %1, %shift, %int1 : {h}, {c}, !torch.int -> {h}
          %3 = torch.aten.add.Tensor %2, %x1, %int1 : {h}, {h}, !torch.int -> {h}
          %4 = torch.aten.relu %3 : {h} -> {h}
          %5 = torch.aten.mm %4, %w2 : {h}, {w2} -> {out}
          %6 = torch.aten.relu %5 : {out} -> {out}
          return %6 : {out}
        }}
    """


def test_a_matmul_after_one_left_to_iree_data_tiling_is_left_to_it_too(filecheck):
    # MobileNetV3 at 8 images: the 1x1 convolution onto 80 channels (46 MFLOP, too small
    # to pack) and, through its BatchNorm and the residual add, the next block's onto 480.
    # Packed in tori's tiles, the second's pack joined the first's unpack from IREE's
    # tiles in one dispatch, whose vector IREE refused ("large vector sizes").
    output = filecheck(residual_block(184, broadcast_only=False), """
        # CHECK-LABEL: func.func @block
        # CHECK:         torch.aten.mm %{{.+}} : !torch.vtensor<[1568,184],f32>
        # CHECK:         torch.aten.mm %{{.+}} : !torch.vtensor<[1568,80],f32>, !torch.vtensor<[80,480],f32>
    """)
    assert "tori_packed_mm" not in output
    # A matmul that reaches the second only through a broadcast operand (a gate of 8x80)
    # leaves it packed.
    filecheck(residual_block(184, broadcast_only=True), """
        # CHECK-LABEL: func.func @block
        # CHECK:         torch.aten.mm %{{.+}} : !torch.vtensor<[8,184],f32>
        # CHECK:         call @tori_packed_mm_1568x80x480_14x32(
    """)
    # A first matmul large enough to pack (onto 80 from 480 channels: 120 MFLOP) is
    # packed, and so is the one after it.
    output = filecheck(residual_block(480, broadcast_only=False), """
        # CHECK-LABEL: func.func @block
        # CHECK:         call @tori_packed_mm_1568x480x80_14x32(
        # CHECK:         call @tori_packed_mm_1568x80x480_14x32(
    """)
    assert "torch.aten.mm" not in output


def mlp(m: int, k: int, n: int, tail: str = "", extra_args: str = "", returned: str = "") -> str:
    """`@mlp`: a linear layer [m, k] -> [m, n] viewed as [1, m, n], its bias added, x *
    relu(x) of it, viewed back and multiplied by an [n, k] weight's transpose, a ReLU
    after it; `tail`: ops in place of x * relu(x) reading %4 ([1, m, n]), the last of
    them %h; `returned`: %h's type, %h also returned."""
    x, w1, w2 = t(m, k), t(n, k), t(k, n)
    h, h3 = t(m, n), t(1, m, n)
    tail = tail or f"""%r = torch.aten.relu %4 : {h3} -> {h3}
          %h = torch.aten.mul.Tensor %r, %4 : {h3}, {h3} -> {h3}"""
    return f"""
        func.func @mlp(%arg0: {x}, %arg1: {w1}, %arg2: {t(n)}, %arg3: {w2}{extra_args}) -> ({t(m, k)}{returned and ', ' + returned}) {{
          {DIMS}
          %int1_0 = torch.constant.int 1
          %intm = torch.constant.int {m}
          %intn = torch.constant.int {n}
          %size3 = torch.prim.ListConstruct %int1_0, %intm, %intn : (!torch.int, !torch.int, !torch.int) -> !torch.list<int>
          %size2 = torch.prim.ListConstruct %intm, %intn : (!torch.int, !torch.int) -> !torch.list<int>
          %t1 = torch.aten.permute %arg1, %dims : {w1}, !torch.list<int> -> {t(k, n)}
          %0 = torch.aten.mm %arg0, %t1 : {x}, {t(k, n)} -> {h}
          %1 = torch.aten.add.Tensor %0, %arg2, %int1_0 : {h}, {t(n)}, !torch.int -> {h}
          %4 = torch.aten.view %1, %size3 : {h}, !torch.list<int> -> {h3}
          {tail}
          %5 = torch.aten.clone %h, %none : {h3}, !torch.none -> {h3}
          %6 = torch.aten.view %5, %size2 : {h3}, !torch.list<int> -> {h}
          %t2 = torch.aten.permute %arg3, %dims : {w2}, !torch.list<int> -> {t(n, k)}
          %7 = torch.aten.mm %6, %t2 : {h}, {t(n, k)} -> {t(m, k)}
          %8 = torch.aten.relu %7 : {t(m, k)} -> {t(m, k)}
          return %8{returned and ', %h'} : {t(m, k)}{returned and ', ' + returned}
        }}
    """.replace("{DIMS}", DIMS).replace("%int1_0 = torch.constant.int 1\n", "%int1_0 = torch.constant.int 1\n          %none = torch.constant.none\n", 1)


def test_a_hidden_layer_stays_in_its_tiles_between_two_matmuls(filecheck):
    # DeiT-small's MLP at 8 images: 1576 rows in 113 tiles of 14, 1536 hidden columns in
    # 48 tiles of 32. The first matmul's result stays [113, 48, 14, 32]; the bias is
    # viewed [48, 1, 32], the views and the clone go, x * relu(x) runs on the tiles, and
    # the second matmul transposes each tile into its left operand's layout.
    filecheck(mlp(1576, 384, 1536), """
        # CHECK-DAG:   #[[LEFT:map[0-9]*]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d4, d2)>
        # CHECK-DAG:   #[[RIGHT:map[0-9]*]] = affine_map<(d0, d1, d2, d3, d4) -> (d1, d4, d3)>
        # CHECK-DAG:   #[[OUT:map[0-9]*]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
        # CHECK-LABEL: func.func @mlp
        # CHECK:         %[[H:.+]] = call @tori_packed_mm_1576x384x1536_nk_14x32_tiledout(
        # CHECK-SAME:      -> tensor<113x48x14x32xf32>
        # CHECK:         %[[T:.+]] = "torch_c.from_builtin_tensor"(%[[H]]) : (tensor<113x48x14x32xf32>) -> !torch.vtensor<[113,48,14,32],f32>
        # CHECK:         %[[B:.+]] = torch.aten.view %arg2, %{{.+}} : !torch.vtensor<[1536],f32>, !torch.list<int> -> !torch.vtensor<[48,1,32],f32>
        # CHECK:         %[[S:.+]] = torch.aten.add.Tensor %[[T]], %[[B]], %{{.+}} : !torch.vtensor<[113,48,14,32],f32>, !torch.vtensor<[48,1,32],f32>, !torch.int -> !torch.vtensor<[113,48,14,32],f32>
        # CHECK-NOT:     torch.aten.clone
        # CHECK:         %[[R:.+]] = torch.aten.relu %[[S]] : !torch.vtensor<[113,48,14,32],f32> -> !torch.vtensor<[113,48,14,32],f32>
        # CHECK:         %[[P:.+]] = torch.aten.mul.Tensor %[[R]], %[[S]] : !torch.vtensor<[113,48,14,32],f32>, !torch.vtensor<[113,48,14,32],f32>
        # CHECK:         %[[L:.+]] = "torch_c.to_builtin_tensor"(%[[P]])
        # CHECK:         call @tori_packed_mm_1576x1536x384_nk_14x32_tiledin(%[[L]], %{{.+}}) : (tensor<113x48x14x32xf32>, tensor<384x1536xf32>) -> tensor<1576x384xf32>
        # CHECK-NOT:     torch.aten.mm
        # CHECK-LABEL: func.func private @tori_packed_mm_1576x384x1536_nk_14x32_tiledout
        # CHECK:         %[[A:.+]] = linalg.pack %arg0 {{.+}} -> tensor<113x384x14x1xf32>
        # CHECK:         %[[W:.+]] = linalg.pack %arg1 {{.+}} -> tensor<48x384x32x1xf32>
        # CHECK:         %[[C:.+]] = linalg.generic {indexing_maps = [#[[LEFT]], #[[RIGHT]], #[[OUT]]],
        # CHECK-SAME:      iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]
        # CHECK-SAME:      outs(%{{.+}} : tensor<113x48x14x32xf32>)
        # CHECK-SAME:      distribution = [38, 1, 0, 0, 0], vector_common_parallel = [1, 1, 14, 32, 0], vector_reduction = [0, 0, 0, 0, 1]
        # CHECK-NOT:     linalg.unpack
        # CHECK:         return %[[C]] : tensor<113x48x14x32xf32>
        # CHECK-LABEL: func.func private @tori_packed_mm_1576x1536x384_nk_14x32_tiledin
        # CHECK:         %[[X:.+]] = linalg.transpose ins(%arg0 : tensor<113x48x14x32xf32>) outs(%{{.+}} : tensor<113x48x32x14xf32>) permutation = [0, 1, 3, 2]
        # CHECK:         %[[X3:.+]] = tensor.collapse_shape %[[X]] {{\\[}}[0], [1, 2], [3]] : tensor<113x48x32x14xf32> into tensor<113x1536x14xf32>
        # CHECK:         %[[X4:.+]] = tensor.expand_shape %[[X3]] {{\\[}}[0], [1], [2, 3]] output_shape [113, 1536, 14, 1]
        # CHECK-NOT:     linalg.pack %arg0
        # CHECK:         linalg.mmt4d {{.+}} ins(%[[X4]], %{{.+}} : tensor<113x1536x14x1xf32>, tensor<12x1536x32x1xf32>)
        # CHECK:         linalg.unpack {{.+}} -> tensor<1576x384xf32>
    """)


def test_a_gated_hidden_layer_has_two_matmuls_in_tiles(filecheck):
    # Llama's MLP: silu(x @ gate) * (x @ up), then down.
    m, k, n = 512, 256, 512
    x, w, h = t(m, k), t(n, k), t(m, n)
    filecheck(f"""
        func.func @gated(%arg0: {x}, %arg1: {w}, %arg2: {w}, %arg3: {t(k, n)}) -> {x} {{
          {DIMS}
          %g = torch.aten.permute %arg1, %dims : {w}, !torch.list<int> -> {t(k, n)}
          %u = torch.aten.permute %arg2, %dims : {w}, !torch.list<int> -> {t(k, n)}
          %d = torch.aten.permute %arg3, %dims : {t(k, n)}, !torch.list<int> -> {t(n, k)}
          %0 = torch.aten.mm %arg0, %g : {x}, {t(k, n)} -> {h}
          %1 = torch.aten.silu %0 : {h} -> {h}
          %2 = torch.aten.mm %arg0, %u : {x}, {t(k, n)} -> {h}
          %3 = torch.aten.mul.Tensor %1, %2 : {h}, {h} -> {h}
          %4 = torch.aten.mm %3, %d : {h}, {t(n, k)} -> {x}
          %5 = torch.aten.relu %4 : {x} -> {x}
          return %5 : {x}
        }}
    """, """
        # CHECK-LABEL: func.func @gated
        # CHECK:         call @tori_packed_mm_512x256x512_nk_12x32_tiledout(
        # CHECK:         torch.aten.silu %{{.+}} : !torch.vtensor<[43,16,12,32],f32>
        # CHECK:         call @tori_packed_mm_512x256x512_nk_12x32_tiledout(
        # CHECK:         torch.aten.mul.Tensor %{{.+}}, %{{.+}} : !torch.vtensor<[43,16,12,32],f32>, !torch.vtensor<[43,16,12,32],f32>
        # CHECK:         call @tori_packed_mm_512x512x256_nk_12x32_tiledin(
    """)


def test_hidden_layers_read_elsewhere_or_off_the_tiles_are_unpacked(filecheck):
    # The hidden layer also returned; 1000 hidden columns (31.25 tiles); an operand of
    # one value per row ([m, 1]) that the tiles cannot broadcast; a residual [m, n]; a
    # ReLU alone.
    m, k = 1576, 384
    h3, h = t(1, m, 1536), t(m, 1536)
    returned = mlp(m, k, 1536, returned=h3).replace("@mlp", "@returned")
    odd = mlp(m, k, 1000).replace("@mlp", "@odd")
    rows = mlp(m, k, 1536, tail=f"%h = torch.aten.mul.Tensor %4, %arg4 : {h3}, {t(1, m, 1)} -> {h3}",
               extra_args=f", %arg4: {t(1, m, 1)}").replace("@mlp", "@rows")
    residual = mlp(m, k, 1536, tail=f"%h = torch.aten.add.Tensor %4, %arg4, %int1_0 : {h3}, {h3}, !torch.int -> {h3}",
                   extra_args=f", %arg4: {h3}").replace("@mlp", "@residual")
    # A last op of one value of the chain (T5's ReLU): IREE's transpose propagation
    # would fold the transposition into the contraction, without tori's configuration.
    unary = mlp(m, k, 1536, tail=f"%h = torch.aten.relu %4 : {h3} -> {h3}").replace("@mlp", "@unary")
    output = filecheck(returned + odd + rows + residual + unary, """
        # CHECK-LABEL: func.func @returned
        # CHECK:         call @tori_packed_mm_1576x384x1536_nk_14x32(
        # CHECK:         call @tori_packed_mm_1576x1536x384_nk_14x32(
        # CHECK-LABEL: func.func @odd
        # CHECK:         call @tori_packed_mm_1576x384x1000_nk_14x32(
        # CHECK:         call @tori_packed_mm_1576x1000x384_nk_14x32(
        # CHECK-LABEL: func.func @rows
        # CHECK:         call @tori_packed_mm_1576x384x1536_nk_14x32(
        # CHECK-LABEL: func.func @residual
        # CHECK:         call @tori_packed_mm_1576x384x1536_nk_14x32(
        # CHECK-LABEL: func.func @unary
        # CHECK:         call @tori_packed_mm_1576x384x1536_nk_14x32(
    """)
    assert "tiled" not in output
