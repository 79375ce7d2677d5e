"""FileCheck tests of tori-pooling-nhwc: a float32 2-D max pooling whose indices nobody
reads becomes a call of a channels-last function; every other pooling is left as it is."""

PIPELINE = "tori-pooling-nhwc"


def _pool(x: str, out: str, kernel: int = 3, stride: int = 2, padding: int = 0, dilation: int = 1,
          ceil: str = "%false", op: str = "torch.aten.max_pool2d_with_indices", indices: str = "") -> str:
    index_type = out.replace("f32>", "si64>").replace("f16>", "si64>")
    results = "%0, %1" if op.endswith("with_indices") else "%0"
    result_types = f"{out}, {index_type}" if op.endswith("with_indices") else out
    return f"""
          %false = torch.constant.bool false
          %true = torch.constant.bool true
          %k_ = torch.constant.int {kernel}
          %s_ = torch.constant.int {stride}
          %p_ = torch.constant.int {padding}
          %d_ = torch.constant.int {dilation}
          %kernel = torch.prim.ListConstruct %k_, %k_ : (!torch.int, !torch.int) -> !torch.list<int>
          %stride = torch.prim.ListConstruct %s_, %s_ : (!torch.int, !torch.int) -> !torch.list<int>
          %padding = torch.prim.ListConstruct %p_, %p_ : (!torch.int, !torch.int) -> !torch.list<int>
          %dilation = torch.prim.ListConstruct %d_, %d_ : (!torch.int, !torch.int) -> !torch.list<int>
          {results} = {op} %arg0, %kernel, %stride, %padding, %dilation, {ceil} : {x}, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool -> {result_types}
"""


def test_stem_pooling_becomes_a_channels_last_call(filecheck):
    # ResNet's stem pool as tori's decomposition leaves it: the input padded with -inf
    # before it (113x113), no padding of its own.
    x, out = "!torch.vtensor<[8,64,113,113],f32>", "!torch.vtensor<[8,64,56,56],f32>"
    filecheck(f"""
        func.func @pool(%arg0: {x}) -> {out} {{
          {_pool(x, out)}
          return %0 : {out}
        }}
    """, """
        # CHECK-LABEL: func.func @pool
        # CHECK:         %[[X:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[8,64,113,113],f32>) -> tensor<8x64x113x113xf32>
        # CHECK:         %[[R:.+]] = call @tori_max_pool_8x64x113x113_3x3_s2x2_p0x0_d1x1_f32(%[[X]])
        # CHECK:         %[[T:.+]] = "torch_c.from_builtin_tensor"(%[[R]]) : (tensor<8x64x56x56xf32>) -> !torch.vtensor<[8,64,56,56],f32>
        # CHECK:         return %[[T]]
        # CHECK-NOT:     torch.aten.max_pool2d
        # CHECK-LABEL: func.func private @tori_max_pool_8x64x113x113_3x3_s2x2_p0x0_d1x1_f32
        # CHECK:         %[[LOW:.+]] = arith.constant 0xFF800000 : f32
        # CHECK:         linalg.transpose ins({{.*}} : tensor<8x64x113x113xf32>) outs({{.*}} : tensor<8x113x113x64xf32>) permutation = [0, 2, 3, 1]
        # CHECK-NOT:     tensor.pad
        # CHECK:         linalg.fill ins(%[[LOW]] : f32)
        # CHECK:         %[[P:.+]] = linalg.pooling_nhwc_max {dilations = dense<1> : vector<2xi64>, strides = dense<2> : vector<2xi64>}
        # CHECK-SAME:      ins({{.*}} : tensor<8x113x113x64xf32>, tensor<3x3xf32>) outs({{.*}} : tensor<8x56x56x64xf32>)
        # CHECK:         %[[B:.+]] = "util.optimization_barrier"(%[[P]]) : (tensor<8x56x56x64xf32>) -> tensor<8x56x56x64xf32>
        # CHECK:         linalg.transpose ins(%[[B]] : tensor<8x56x56x64xf32>) outs({{.*}} : tensor<8x64x56x56xf32>) permutation = [0, 3, 1, 2]
    """)


def test_padding_is_minus_infinity_and_reaches_only_what_windows_read(filecheck):
    # max_pool2d(kernel 3, stride 2, padding 1) of 8x9: 4x5 windows; the last row's
    # padding below is in no window (9 rows padded to 2 * 3 + 3 = 9 + 1 above, 0 below).
    x, out = "!torch.vtensor<[1,4,8,9],f32>", "!torch.vtensor<[1,4,4,5],f32>"
    filecheck(f"""
        func.func @pool(%arg0: {x}) -> {out} {{
          {_pool(x, out, padding=1, op="torch.aten.max_pool2d")}
          return %0 : {out}
        }}
    """, """
        # CHECK: call @tori_max_pool_1x4x8x9_3x3_s2x2_p1x1_d1x1_f32
        # CHECK: %[[LOW:.+]] = arith.constant 0xFF800000 : f32
        # CHECK: tensor.pad {{.*}} low[0, 1, 1, 0] high[0, 0, 1, 0]
        # CHECK:   tensor.yield %[[LOW]] : f32
        # CHECK: } : tensor<1x8x9x4xf32> to tensor<1x9x11x4xf32>
        # CHECK: linalg.pooling_nhwc_max
    """)


def test_ceil_mode_pads_after_the_input(filecheck):
    # ceil_mode, 7 -> 4 windows of 2 by 2: the last window reads one value past the input.
    x, out = "!torch.vtensor<[2,3,7,7],f32>", "!torch.vtensor<[2,3,4,4],f32>"
    filecheck(f"""
        func.func @pool(%arg0: {x}) -> {out} {{
          {_pool(x, out, kernel=2, ceil="%true", op="torch.aten.max_pool2d")}
          return %0 : {out}
        }}
    """, """
        # CHECK: tensor.pad {{.*}} low[0, 0, 0, 0] high[0, 1, 1, 0]
        # CHECK: } : tensor<2x7x7x3xf32> to tensor<2x8x8x3xf32>
        # CHECK: linalg.pooling_nhwc_max {{.*}} ins({{.*}} : tensor<2x8x8x3xf32>, tensor<2x2xf32>)
    """)


def test_values_in_no_window_are_cropped(filecheck):
    # 7 -> 3 windows of 2 by 2: the last row and column are in none.
    x, out = "!torch.vtensor<[2,3,7,7],f32>", "!torch.vtensor<[2,3,3,3],f32>"
    filecheck(f"""
        func.func @pool(%arg0: {x}) -> {out} {{
          {_pool(x, out, kernel=2)}
          return %0 : {out}
        }}
    """, """
        # CHECK: tensor.extract_slice {{.*}}[0, 0, 0, 0] [2, 6, 6, 3] [1, 1, 1, 1] : tensor<2x7x7x3xf32> to tensor<2x6x6x3xf32>
        # CHECK-NOT: tensor.pad
        # CHECK: linalg.pooling_nhwc_max {{.*}} ins({{.*}} : tensor<2x6x6x3xf32>, tensor<2x2xf32>)
    """)


def test_one_function_serves_every_pooling_of_its_form(filecheck):
    x, out = "!torch.vtensor<[1,8,9,9],f32>", "!torch.vtensor<[1,8,4,4],f32>"
    output = filecheck(f"""
        func.func @twice(%arg0: {x}) -> ({out}, {out}) {{
          {_pool(x, out)}
          %2, %3 = torch.aten.max_pool2d_with_indices %arg0, %kernel, %stride, %padding, %dilation, %false : {x}, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool -> {out}, !torch.vtensor<[1,8,4,4],si64>
          return %0, %2 : {out}, {out}
        }}
    """, """
        # CHECK-COUNT-2: call @tori_max_pool_1x8x9x9_3x3_s2x2_p0x0_d1x1_f32
    """)
    assert output.count("func.func private @tori_max_pool") == 1


def test_other_poolings_are_left_as_they_are(filecheck):
    x, out = "!torch.vtensor<[1,8,9,9],f32>", "!torch.vtensor<[1,8,4,4],f32>"
    cases = {
        # the indices are read (a backward pass would)
        "indices": (x, out, "return %0, %1 : {out}, !torch.vtensor<[1,8,4,4],si64>", f"({out}, !torch.vtensor<[1,8,4,4],si64>)"),
        "float16": ("!torch.vtensor<[1,8,9,9],f16>", "!torch.vtensor<[1,8,4,4],f16>", "return %0 : {out}", "{out}"),
        "dynamic": ("!torch.vtensor<[?,8,9,9],f32>", "!torch.vtensor<[?,8,4,4],f32>", "return %0 : {out}", "{out}"),
    }
    for case, (x, out, ret, result) in cases.items():
        output = filecheck(f"""
            func.func @pool(%arg0: {x}) -> {result.format(out=out)} {{
              {_pool(x, out)}
              {ret.format(out=out)}
            }}
        """, """
            # CHECK: torch.aten.max_pool2d_with_indices
            # CHECK-NOT: call @tori_max_pool
        """)
        assert "tori_max_pool" not in output, case


def test_nothing_changes_for_other_targets(filecheck):
    x, out = "!torch.vtensor<[1,8,9,9],f32>", "!torch.vtensor<[1,8,4,4],f32>"
    filecheck(f"""
        func.func @pool(%arg0: {x}) -> {out} {{
          {_pool(x, out, op="torch.aten.max_pool2d")}
          return %0 : {out}
        }}
    """, """
        # CHECK: torch.aten.max_pool2d
        # CHECK-NOT: call @tori_max_pool
    """, pipeline="tori-pooling-nhwc{cpu=false}")
