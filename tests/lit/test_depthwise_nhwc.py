"""FileCheck tests of tori-depthwise-nhwc: float32 depthwise convolutions become a call
of a channels-last function, one input channel's a call of a sum of taps; every other
convolution is left as it is."""

PIPELINE = "tori-depthwise-nhwc"


def _conv(x: str, w: str, out: str, bias: str = "%none", groups: int = 8, stride: int = 1, padding: int = 1,
          transposed: str = "%false", bias_type: str = "!torch.none") -> str:
    return f"""
          %false = torch.constant.bool false
          %none = torch.constant.none
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %stride_ = torch.constant.int {stride}
          %pad_ = torch.constant.int {padding}
          %groups = torch.constant.int {groups}
          %stride = torch.prim.ListConstruct %stride_, %stride_ : (!torch.int, !torch.int) -> !torch.list<int>
          %padding = torch.prim.ListConstruct %pad_, %pad_ : (!torch.int, !torch.int) -> !torch.list<int>
          %dilation = torch.prim.ListConstruct %int1, %int1 : (!torch.int, !torch.int) -> !torch.list<int>
          %outpad = torch.prim.ListConstruct %int0, %int0 : (!torch.int, !torch.int) -> !torch.list<int>
          %0 = torch.aten.convolution %arg0, %arg1, {bias}, %stride, %padding, %dilation, {transposed}, %outpad, %groups : {x}, {w}, {bias_type}, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> {out}
"""


def test_depthwise_with_bias_becomes_a_channels_last_call(filecheck):
    x, w, b, out = ("!torch.vtensor<[2,8,10,10],f32>", "!torch.vtensor<[8,1,3,3],f32>", "!torch.vtensor<[8],f32>",
                    "!torch.vtensor<[2,8,5,5],f32>")
    filecheck(f"""
        func.func @dw(%arg0: {x}, %arg1: {w}, %arg2: {b}) -> {out} {{
          {_conv(x, w, out, bias="%arg2", stride=2, bias_type=b)}
          return %0 : {out}
        }}
    """, """
        # CHECK-LABEL: func.func @dw
        # CHECK-DAG:     %[[X:.+]] = "torch_c.to_builtin_tensor"(%arg0) : (!torch.vtensor<[2,8,10,10],f32>) -> tensor<2x8x10x10xf32>
        # CHECK-DAG:     %[[W:.+]] = "torch_c.to_builtin_tensor"(%arg1)
        # CHECK-DAG:     %[[B:.+]] = "torch_c.to_builtin_tensor"(%arg2)
        # CHECK:         %[[R:.+]] = call @tori_depthwise_2x8x10x10_3x3_s2x2_p1x1_d1x1_bias_f32(%[[X]], %[[W]], %[[B]])
        # CHECK:         %[[T:.+]] = "torch_c.from_builtin_tensor"(%[[R]]) : (tensor<2x8x5x5xf32>) -> !torch.vtensor<[2,8,5,5],f32>
        # CHECK:         return %[[T]]
        # CHECK-NOT:     torch.aten.convolution
        # CHECK-LABEL: func.func private @tori_depthwise_2x8x10x10_3x3_s2x2_p1x1_d1x1_bias_f32
        # CHECK:         linalg.transpose {{.*}} permutation = [0, 2, 3, 1]
        # CHECK:         tensor.pad {{.*}} low[0, 1, 1, 0] high[0, 1, 1, 0]
        # CHECK:         linalg.transpose {{.*}} permutation = [1, 2, 0]
        # CHECK:         linalg.generic {indexing_maps = [#[[IN:.+]], #{{.+}}, #{{.+}}]
        # CHECK-SAME:      ins({{.*}} : tensor<2x12x12x8xf32>, tensor<3x3x8xf32>) outs({{.*}} : tensor<2x5x5x8xf32>)
        # CHECK:         arith.mulf
        # CHECK:         arith.addf
        # CHECK:         linalg.generic
        # CHECK:         linalg.transpose {{.*}} permutation = [0, 3, 1, 2]
        # CHECK:         return {{.*}} : tensor<2x8x5x5xf32>
    """)


def test_strides_and_dilations_index_the_padded_input(filecheck):
    x, w, out = "!torch.vtensor<[1,4,9,9],f32>", "!torch.vtensor<[4,1,3,3],f32>", "!torch.vtensor<[1,4,4,4],f32>"
    output = filecheck(f"""
        func.func @dw(%arg0: {x}, %arg1: {w}) -> {out} {{
          {_conv(x, w, out, groups=4, stride=2)}
          return %0 : {out}
        }}
    """, """
        # CHECK: (d0, d1, d2, d3, d4, d5) -> (d0, d1 * 2 + d4, d2 * 2 + d5, d3)
    """)
    assert "_bias" not in output


def test_one_function_serves_every_convolution_of_its_form(filecheck):
    x, w = "!torch.vtensor<[1,8,6,6],f32>", "!torch.vtensor<[8,1,3,3],f32>"
    output = filecheck(f"""
        func.func @twice(%arg0: {x}, %arg1: {w}) -> ({x}, {x}) {{
          {_conv(x, w, x)}
          %1 = torch.aten.convolution %0, %arg1, %none, %stride, %padding, %dilation, %false, %outpad, %groups : {x}, {w}, !torch.none, !torch.list<int>, !torch.list<int>, !torch.list<int>, !torch.bool, !torch.list<int>, !torch.int -> {x}
          return %0, %1 : {x}, {x}
        }}
    """, """
        # CHECK-COUNT-2: call @tori_depthwise_1x8x6x6_3x3_s1x1_p1x1_d1x1_f32
    """)
    assert output.count("func.func private @tori_depthwise") == 1


def test_one_input_channel_becomes_a_sum_of_taps(filecheck):
    # A spectrogram's first convolution: one input channel into 16, 3x3, with a bias.
    x, w, b, out = ("!torch.vtensor<[4,1,64,101],f32>", "!torch.vtensor<[16,1,3,3],f32>", "!torch.vtensor<[16],f32>",
                    "!torch.vtensor<[4,16,64,101],f32>")
    output = filecheck(f"""
        func.func @spectrogram(%arg0: {x}, %arg1: {w}, %arg2: {b}) -> {out} {{
          {_conv(x, w, out, bias="%arg2", groups=1, bias_type=b)}
          return %0 : {out}
        }}
    """, """
        # CHECK-LABEL: func.func @spectrogram
        # CHECK:         call @tori_depthwise_4x1x64x101_3x3_s1x1_p1x1_d1x1_m16_bias_f32
        # CHECK-NOT:     torch.aten.convolution
        # CHECK-LABEL: func.func private @tori_depthwise_4x1x64x101_3x3_s1x1_p1x1_d1x1_m16_bias_f32
        # CHECK:         tensor.pad {{.*}} low[0, 1, 1] high[0, 1, 1]
        # CHECK:         linalg.transpose {{.*}} permutation = [1, 0]
        # CHECK-COUNT-9: tensor.extract_slice
        # CHECK:         tensor.extract_slice %{{.*}}[0, 2, 2] [4, 64, 101] [1, 1, 1] : tensor<4x66x103xf32> to tensor<4x64x101xf32>
        # CHECK:         linalg.generic
        # CHECK-SAME:      iterator_types = ["parallel", "parallel", "parallel", "parallel"]
        # CHECK-SAME:      outs({{.*}} : tensor<4x16x64x101xf32>)
        # CHECK-COUNT-9: arith.mulf
        # CHECK:         linalg.yield
        # CHECK-NOT:     linalg.transpose
        # CHECK:         return {{.*}} : tensor<4x16x64x101xf32>
    """)
    assert output.count("arith.addf") == 9  # eight between the taps, one for the bias


def test_other_convolutions_are_left_as_they_are(filecheck):
    cases = [
        # grouped, two channels per group
        ("!torch.vtensor<[1,8,6,6],f32>", "!torch.vtensor<[8,2,3,3],f32>", "!torch.vtensor<[1,8,6,6],f32>", 4),
        # one group
        ("!torch.vtensor<[1,8,6,6],f32>", "!torch.vtensor<[8,8,3,3],f32>", "!torch.vtensor<[1,8,6,6],f32>", 1),
        # float16
        ("!torch.vtensor<[1,8,6,6],f16>", "!torch.vtensor<[8,1,3,3],f16>", "!torch.vtensor<[1,8,6,6],f16>", 8),
        # dynamic batch
        ("!torch.vtensor<[?,8,6,6],f32>", "!torch.vtensor<[8,1,3,3],f32>", "!torch.vtensor<[?,8,6,6],f32>", 8),
        # channel multiplier
        ("!torch.vtensor<[1,4,6,6],f32>", "!torch.vtensor<[8,1,3,3],f32>", "!torch.vtensor<[1,8,6,6],f32>", 4),
        # one input channel, more taps than MAX_TAPS
        ("!torch.vtensor<[1,1,16,16],f32>", "!torch.vtensor<[8,1,9,9],f32>", "!torch.vtensor<[1,8,10,10],f32>", 1),
    ]
    for x, w, out, groups in cases:
        output = filecheck(f"""
            func.func @conv(%arg0: {x}, %arg1: {w}) -> {out} {{
              {_conv(x, w, out, groups=groups)}
              return %0 : {out}
            }}
        """, """
            # CHECK: torch.aten.convolution
            # CHECK-NOT: call @tori_depthwise
        """)
        assert "tori_depthwise" not in output
