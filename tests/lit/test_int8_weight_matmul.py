"""FileCheck tests of tori-int8-weight-matmul: a float32 matmul against an int8 weight
transposed and widened (either order) becomes a call of one contraction that reads
the int8 weight packed in blocks of 16 rows (of 64 for a matvec); other matmuls, and
modules for other targets than CPUs, are left as they are."""

PIPELINE = "tori-int8-weight-matmul"

X, W, WF, WT, OUT = ("!torch.vtensor<[2,64],f32>", "!torch.vtensor<[32,64],si8>", "!torch.vtensor<[32,64],f32>",
                     "!torch.vtensor<[64,32],f32>", "!torch.vtensor<[2,32],f32>")
DIMS = """
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %int6 = torch.constant.int 6
          %dims = torch.prim.ListConstruct %int1, %int0 : (!torch.int, !torch.int) -> !torch.list<int>"""


def widened_weight_mm(m: int, n: int, k: int = 64) -> str:
    """`@wo`: mm of an [m, k] float32 matrix and an [n, k] int8 weight widened, then transposed."""
    x, w, wf, wt, out = (f"!torch.vtensor<[{m},{k}],f32>", f"!torch.vtensor<[{n},{k}],si8>",
                         f"!torch.vtensor<[{n},{k}],f32>", f"!torch.vtensor<[{k},{n}],f32>",
                         f"!torch.vtensor<[{m},{n}],f32>")
    return f"""
        func.func @wo(%arg0: {x}, %arg1: {w}) -> {out} {{
          {DIMS}
          %c = torch.prims.convert_element_type %arg1, %int6 : {w}, !torch.int -> {wf}
          %t = torch.aten.permute %c, %dims : {wf}, !torch.list<int> -> {wt}
          %0 = torch.aten.mm %arg0, %t : {x}, {wt} -> {out}
          return %0 : {out}
        }}
    """


def test_widened_then_transposed_weight_becomes_one_contraction(filecheck):
    filecheck(widened_weight_mm(2, 32), """
        # CHECK-LABEL: func.func @wo
        # CHECK-DAG:     %[[X:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[2,64],f32>) -> tensor<2x64xf32>
        # CHECK-DAG:     %[[W:.+]] = "torch_c.to_builtin_tensor"(%arg1) : (!torch.vtensor<[32,64],si8>) -> tensor<32x64xi8>
        # CHECK:         %[[R:.+]] = call @tori_int8_weight_mm_2x64x32(%[[X]], %[[W]])
        # CHECK:         "torch_c.from_builtin_tensor"(%[[R]]) : (tensor<2x32xf32>) -> !torch.vtensor<[2,32],f32>
        # CHECK-NOT:     torch.aten.mm
        # CHECK-LABEL: func.func private @tori_int8_weight_mm_2x64x32
        # CHECK:         %[[B:.+]] = linalg.pack %{{.+}} padding_value(%{{.+}} : i8) inner_dims_pos = [0] inner_tiles = [16]
        # CHECK-SAME:      : tensor<32x64xi8> -> tensor<2x64x16xi8>
        # CHECK:         linalg.generic
        # CHECK-SAME:      ins(%{{.+}}, %[[B]] : tensor<2x64xf32>, tensor<2x64x16xi8>) outs(%{{.+}} : tensor<2x2x16xf32>)
        # CHECK:         arith.sitofp %{{.+}} : i8 to f32
        # CHECK:         arith.mulf
        # CHECK:         arith.addf
        # CHECK:         tensor.collapse_shape %{{.+}} {{\[}}[0], [1, 2]] : tensor<2x2x16xf32> into tensor<2x32xf32>
        # CHECK-NOT:     tensor.extract_slice
    """)


def test_transposed_then_widened_weight_becomes_the_same_call(filecheck):
    filecheck(f"""
        func.func @wo(%arg0: {X}, %arg1: {W}) -> {OUT} {{
          {DIMS}
          %t = torch.aten.permute %arg1, %dims : {W}, !torch.list<int> -> !torch.vtensor<[64,32],si8>
          %c = torch.prims.convert_element_type %t, %int6 : !torch.vtensor<[64,32],si8>, !torch.int -> {WT}
          %0 = torch.aten.mm %arg0, %c : {X}, {WT} -> {OUT}
          return %0 : {OUT}
        }}
    """, """
        # CHECK-LABEL: func.func @wo
        # CHECK:         call @tori_int8_weight_mm_2x64x32
        # CHECK-NOT:     torch.aten.mm
    """)


def test_rows_short_of_a_block_are_padded_and_sliced_off(filecheck):
    filecheck(widened_weight_mm(2, 40), """
        # CHECK-LABEL: func.func private @tori_int8_weight_mm_2x64x40
        # CHECK:         linalg.pack %{{.+}} padding_value(%{{.+}} : i8) {{.+}} : tensor<40x64xi8> -> tensor<3x64x16xi8>
        # CHECK:         tensor.collapse_shape {{.+}} into tensor<2x48xf32>
        # CHECK:         tensor.extract_slice %{{.+}}[0, 0] [2, 40] [1, 1] : tensor<2x48xf32> to tensor<2x40xf32>
    """)


def test_many_rows_are_left_to_the_widened_matmul(filecheck):
    filecheck(widened_weight_mm(129, 32), """
        # CHECK-LABEL: func.func @wo
        # CHECK:         torch.aten.mm
        # CHECK-NOT:     call @tori_int8_weight_mm
    """)


def test_float_weights_and_other_integers_are_left_alone(filecheck):
    i16 = "!torch.vtensor<[32,64],si16>"
    filecheck(f"""
        func.func @f(%arg0: {X}, %arg1: {WF}, %arg2: {i16}) -> ({OUT}, {OUT}) {{
          {DIMS}
          %t = torch.aten.permute %arg1, %dims : {WF}, !torch.list<int> -> {WT}
          %0 = torch.aten.mm %arg0, %t : {X}, {WT} -> {OUT}
          %c = torch.prims.convert_element_type %arg2, %int6 : {i16}, !torch.int -> {WF}
          %u = torch.aten.permute %c, %dims : {WF}, !torch.list<int> -> {WT}
          %1 = torch.aten.mm %arg0, %u : {X}, {WT} -> {OUT}
          return %0, %1 : {OUT}, {OUT}
        }}
    """, """
        # CHECK-LABEL: func.func @f
        # CHECK:         torch.aten.mm
        # CHECK:         torch.aten.mm
        # CHECK-NOT:     call @tori_int8_weight_mm
    """)



def test_a_matvec_reads_blocks_of_64_rows_in_one_vector_tile(filecheck):
    """A matvec's contraction reads whole 64-row blocks (one cache line per step along
    K), with IREE's CPU tiling set on it."""
    filecheck(widened_weight_mm(1, 200), """
        # CHECK-LABEL: func.func @wo
        # CHECK:         call @tori_int8_weight_mm_1x64x200
        # CHECK-LABEL: func.func private @tori_int8_weight_mm_1x64x200
        # CHECK:         linalg.pack %{{.+}} inner_tiles = [64] {{.+}} : tensor<200x64xi8> -> tensor<4x64x64xi8>
        # CHECK:         linalg.generic
        # CHECK-SAME:      ins(%{{.+}}, %{{.+}} : tensor<64xf32>, tensor<4x64x64xi8>) outs(%{{.+}} : tensor<4x64xf32>)
        # CHECK-SAME:      compilation_info = #iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<distribution = [1, 64, 0], vector_common_parallel = [1, 64, 0], vector_reduction = [0, 0, 8]>
        # CHECK:         arith.sitofp %{{.+}} : i8 to f32
        # CHECK:         tensor.extract_slice %{{.+}}[0, 0] [1, 200] [1, 1] : tensor<1x256xf32> to tensor<1x200xf32>
    """)


def test_modules_for_other_targets_keep_their_matmuls(filecheck):
    filecheck(widened_weight_mm(1, 32), """
        # CHECK-LABEL: func.func @wo
        # CHECK:         torch.aten.mm
        # CHECK-NOT:     tori_int8_weight_mm
    """, pipeline="tori-int8-weight-matmul{cpu=false}")
