"""FileCheck tests of tori-specialize-guards: guard facts become static sizes and
symbolic-shape bindings that IREE turns into integer assumptions."""

PIPELINE = "tori-specialize-guards"


def test_a_pinned_dim_becomes_static_in_the_signature(filecheck):
    filecheck("""
        func.func @pinned(%arg0: !torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 3 : i64, max = 3 : i64, divisor = 1 : i64} : (!torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32>
          %1 = torch.aten.relu %0 : !torch.vtensor<[?,4],f32> -> !torch.vtensor<[?,4],f32>
          return %1 : !torch.vtensor<[?,4],f32>
        }
    """, """
        # CHECK-LABEL: func.func @pinned(%arg0: !torch.vtensor<[3,4],f32>) -> !torch.vtensor<[?,4],f32>
        # CHECK-NEXT:    %[[CAST:.+]] = torch.tensor_static_info_cast %arg0 : !torch.vtensor<[3,4],f32> to !torch.vtensor<[?,4],f32>
        # CHECK-NOT:     torch.bind_symbolic_shape
        # CHECK:         %[[FACTS:.+]] = "tori.dim_facts"(%[[CAST]])
        # CHECK:         torch.aten.relu %[[FACTS]]
    """)


def test_range_and_divisor_become_a_symbolic_shape_binding(filecheck):
    filecheck("""
        func.func @ranged(%arg0: !torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 16 : i64, max = 64 : i64, divisor = 8 : i64} : (!torch.vtensor<[?,4],f32>) -> !torch.vtensor<[?,4],f32>
          return %0 : !torch.vtensor<[?,4],f32>
        }
    """, """
        # CHECK-LABEL: func.func @ranged(%arg0: !torch.vtensor<[?,4],f32>)
        # CHECK-NEXT:    %[[S:.+]] = torch.symbolic_int "s0" {min_val = 2, max_val = 8} : !torch.int
        # CHECK-NEXT:    torch.bind_symbolic_shape %arg0, [%[[S]]], affine_map<()[s0] -> (s0 * 8, 4)> : !torch.vtensor<[?,4],f32>
        # CHECK-NEXT:    "tori.dim_facts"(%arg0)
    """)


def test_an_unbounded_range_binds_up_to_the_largest_i64_and_dims_without_facts_get_their_own_symbol(filecheck):
    filecheck("""
        func.func @open(%arg0: !torch.vtensor<[?,?],f32>) -> !torch.vtensor<[?,?],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 1 : i64, min = 2 : i64, max = "inf", divisor = 1 : i64} : (!torch.vtensor<[?,?],f32>) -> !torch.vtensor<[?,?],f32>
          return %0 : !torch.vtensor<[?,?],f32>
        }
    """, """
        # CHECK-LABEL: func.func @open
        # CHECK:         %[[S0:.+]] = torch.symbolic_int "s0" {min_val = 0, max_val = 9223372036854775807}
        # CHECK:         %[[S1:.+]] = torch.symbolic_int "s1" {min_val = 2, max_val = 9223372036854775807}
        # CHECK:         torch.bind_symbolic_shape %arg0, [%[[S0]], %[[S1]]], affine_map<()[s0, s1] -> (s0, s1)>
    """)


def test_a_pinned_int_argument_is_read_as_a_constant(filecheck):
    filecheck("""
        func.func @int(%arg0: !torch.int, %arg1: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
          %0 = "tori.int_facts"(%arg0) {min = 5 : i64, max = 5 : i64, divisor = 1 : i64} : (!torch.int) -> !torch.int
          %1 = torch.aten.add.Scalar %arg1, %0, %0 : !torch.vtensor<[?],f32>, !torch.int, !torch.int -> !torch.vtensor<[?],f32>
          return %1 : !torch.vtensor<[?],f32>
        }
    """, """
        # CHECK-LABEL: func.func @int(%arg0: !torch.int, %arg1: !torch.vtensor<[?],f32>)
        # CHECK:         %[[C:.+]] = torch.constant.int 5
        # CHECK:         "tori.int_facts"(%[[C]])
    """)


def test_arguments_without_facts_are_unchanged(filecheck):
    out = filecheck("""
        func.func @plain(%arg0: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
          %0 = torch.aten.relu %arg0 : !torch.vtensor<[?],f32> -> !torch.vtensor<[?],f32>
          return %0 : !torch.vtensor<[?],f32>
        }
    """, """
        # CHECK-LABEL: func.func @plain(%arg0: !torch.vtensor<[?],f32>)
        # CHECK-NEXT:    torch.aten.relu %arg0
    """)
    assert "bind_symbolic_shape" not in out and "symbolic_int" not in out


def test_running_twice_binds_once(filecheck):
    out = filecheck("""
        func.func @twice(%arg0: !torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 8 : i64, max = 64 : i64, divisor = 8 : i64} : (!torch.vtensor<[?],f32>) -> !torch.vtensor<[?],f32>
          return %0 : !torch.vtensor<[?],f32>
        }
    """, """
        # CHECK: torch.bind_symbolic_shape %arg0
    """, pipeline="tori-specialize-guards, tori-specialize-guards")
    assert out.count("torch.bind_symbolic_shape") == 1


def test_a_pinned_dim_of_an_argument_with_dynamic_dims_is_bound_before_its_cast(filecheck):
    # IREE ties an argument's uses after its binding to the bound value: a cast placed
    # before the binding then used a value defined after it ("operand #0 does not
    # dominate this use", a dynamic x[1:] first called with 2 rows).
    filecheck("""
        func.func @pinned_and_dynamic(%arg0: !torch.vtensor<[?,?],f32>) -> !torch.vtensor<[?,?],f32> {
          %0 = "tori.dim_facts"(%arg0) {dim = 0 : i64, min = 2 : i64, max = 2 : i64, divisor = 1 : i64} : (!torch.vtensor<[?,?],f32>) -> !torch.vtensor<[?,?],f32>
          %1 = "tori.dim_facts"(%0) {dim = 1 : i64, min = 2 : i64, max = 8 : i64, divisor = 1 : i64} : (!torch.vtensor<[?,?],f32>) -> !torch.vtensor<[?,?],f32>
          %2 = torch.aten.relu %1 : !torch.vtensor<[?,?],f32> -> !torch.vtensor<[?,?],f32>
          return %2 : !torch.vtensor<[?,?],f32>
        }
    """, """
        # CHECK-LABEL: func.func @pinned_and_dynamic(%arg0: !torch.vtensor<[2,?],f32>)
        # CHECK-NEXT:    %[[S0:.+]] = torch.symbolic_int "s0" {min_val = 2, max_val = 8}
        # CHECK-NEXT:    torch.bind_symbolic_shape %arg0, [%[[S0]]], affine_map<()[s0] -> (2, s0)> : !torch.vtensor<[2,?],f32>
        # CHECK-NEXT:    %[[CAST:.+]] = torch.tensor_static_info_cast %arg0 : !torch.vtensor<[2,?],f32> to !torch.vtensor<[?,?],f32>
        # CHECK-NEXT:    "tori.dim_facts"(%[[CAST]])
    """)
