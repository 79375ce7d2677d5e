"""FileCheck tests of tori-fuse-layer-norm: layer norm in var_mean form in, one
native_layer_norm out; and the forms that must stay as they are."""

PIPELINE = "tori-fuse-layer-norm"

X = "!torch.vtensor<[2,8],f32>"
STAT = "!torch.vtensor<[2,1],f32>"
P = "!torch.vtensor<[8],f32>"


def layer_norm(correction: str = "%int0", dims: str = "%int-1", affine: bool = True,
               extra_results: str = "", extra_types: str = "") -> str:
    tail = "%norm"
    affine_ops = ""
    if affine:
        tail = "%shifted"
        affine_ops = f"""
          %scaled = torch.aten.mul.Tensor %norm, %w : {X}, {P} -> {X}
          %shifted = torch.aten.add.Tensor %scaled, %b, %int1 : {X}, {P}, !torch.int -> {X}"""
    return f"""
        func.func @ln(%x: {X}, %w: {P}, %b: {P}) -> ({X}{extra_types}) {{
          %int0 = torch.constant.int 0
          %int1 = torch.constant.int 1
          %int-1 = torch.constant.int -1
          %true = torch.constant.bool true
          %eps = torch.constant.float 1.0e-05
          %dims = torch.prim.ListConstruct {dims} : (!torch.int) -> !torch.list<int>
          %var, %mean = torch.aten.var_mean.correction %x, %dims, {correction}, %true : {X}, !torch.list<int>, !torch.int, !torch.bool -> {STAT}, {STAT}
          %0 = torch.aten.add.Scalar %var, %eps, %int1 : {STAT}, !torch.float, !torch.int -> {STAT}
          %1 = torch.aten.rsqrt %0 : {STAT} -> {STAT}
          %2 = torch.aten.sub.Tensor %x, %mean, %int1 : {X}, {STAT}, !torch.int -> {X}
          %norm = torch.aten.mul.Tensor %2, %1 : {X}, {STAT} -> {X}{affine_ops}
          return {tail}{extra_results} : {X}{extra_types}
        }}
    """


def test_var_mean_form_with_weight_and_bias_becomes_native_layer_norm(filecheck):
    filecheck(layer_norm(), """
        # CHECK-LABEL: func.func @ln
        # CHECK:         %[[EPS:.+]] = torch.constant.float 1.000000e-05
        # CHECK:         %[[Y:.+]], %{{.+}}, %{{.+}} = torch.aten.native_layer_norm %arg0, %{{.+}}, %arg1, %arg2, %[[EPS]] : !torch.vtensor<[2,8],f32>, !torch.list<int>, !torch.vtensor<[8],f32>, !torch.vtensor<[8],f32>, !torch.float -> !torch.vtensor<[2,8],f32>, !torch.vtensor<[2,1],f32>, !torch.vtensor<[2,1],f32>
        # CHECK-NEXT:    return %[[Y]]
        # CHECK-NOT:     torch.aten.var_mean.correction
    """)


def test_without_affine_weight_and_bias_are_none(filecheck):
    filecheck(layer_norm(affine=False), """
        # CHECK: torch.aten.native_layer_norm %arg0, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : !torch.vtensor<[2,8],f32>, !torch.list<int>, !torch.none, !torch.none, !torch.float
        # CHECK-NOT: torch.aten.rsqrt
    """)


def test_unbiased_variance_stays(filecheck):
    filecheck(layer_norm(correction="%int1"), """
        # CHECK-NOT: torch.aten.native_layer_norm
        # CHECK:     torch.aten.var_mean.correction
    """)


def test_reduction_over_a_leading_dim_stays(filecheck):
    filecheck(layer_norm(dims="%int0"), """
        # CHECK-NOT: torch.aten.native_layer_norm
    """)


def test_normalized_value_used_elsewhere_keeps_the_affine_out(filecheck):
    # The normalized tensor is also returned: the weight and bias stay, and it is
    # not normalized twice.
    filecheck(layer_norm(extra_results=", %norm", extra_types=f", {X}"), """
        # CHECK:     %[[N:.+]], %{{.+}}, %{{.+}} = torch.aten.native_layer_norm %arg0, %{{.+}}, %{{.+}}, %{{.+}}, %{{.+}} : {{.*}}, !torch.none, !torch.none
        # CHECK:     torch.aten.mul.Tensor %[[N]], %arg1
        # CHECK:     torch.aten.add.Tensor
    """)


def test_variance_used_elsewhere_stays(filecheck):
    filecheck(layer_norm(extra_results=", %var", extra_types=f", {STAT}"), """
        # CHECK-NOT: torch.aten.native_layer_norm
        # CHECK:     torch.aten.var_mean.correction
    """)


TWO_MEANS = f"""
    func.func @ln(%x: {X}, %w: {P}) -> {X} {{
      %int1 = torch.constant.int 1
      %int-1 = torch.constant.int -1
      %true = torch.constant.bool true
      %none = torch.constant.none
      %eps = torch.constant.float 1.0e-05
      %dims = torch.prim.ListConstruct %int-1 : (!torch.int) -> !torch.list<int>
      %mean = torch.aten.mean.dim %x, %dims, %true, %none : {X}, !torch.list<int>, !torch.bool, !torch.none -> {STAT}
      %c = torch.aten.sub.Tensor %x, %mean, %int1 : {X}, {STAT}, !torch.int -> {X}
      %sq = torch.aten.mul.Tensor %c, %c : {X}, {X} -> {X}
      %var = torch.aten.mean.dim %sq, %dims, %true, %none : {X}, !torch.list<int>, !torch.bool, !torch.none -> {STAT}
      %0 = torch.aten.add.Scalar %var, %eps, %int1 : {STAT}, !torch.float, !torch.int -> {STAT}
      %1 = torch.aten.rsqrt %0 : {STAT} -> {STAT}
      %norm = torch.aten.mul.Tensor %c, %1 : {X}, {STAT} -> {X}
      %y = torch.aten.mul.Tensor %norm, %w : {X}, {P} -> {X}
      return %y : {X}
    }}
"""


def test_two_mean_form_of_tori_decomposition_becomes_native_layer_norm(filecheck):
    filecheck(TWO_MEANS, """
        # CHECK-LABEL: func.func @ln
        # CHECK:         %[[Y:.+]], %{{.+}}, %{{.+}} = torch.aten.native_layer_norm %arg0, %{{.+}}, %arg1, %{{.+}}, %{{.+}} : !torch.vtensor<[2,8],f32>, !torch.list<int>, !torch.vtensor<[8],f32>, !torch.none, !torch.float
        # CHECK-NEXT:    return %[[Y]]
        # CHECK-NOT:     torch.aten.mean.dim
    """)


def test_two_means_over_different_dims_stay(filecheck):
    filecheck(TWO_MEANS.replace("%var = torch.aten.mean.dim %sq, %dims", "%var = torch.aten.mean.dim %sq, %other")
              .replace("%eps = torch.constant.float 1.0e-05", "%eps = torch.constant.float 1.0e-05\n"
                       "      %int0 = torch.constant.int 0\n"
                       "      %other = torch.prim.ListConstruct %int0 : (!torch.int) -> !torch.list<int>"), """
        # CHECK-NOT: torch.aten.native_layer_norm
    """)
