"""`torch.compiler.nested_compile_region`: AOTAutograd's `invoke_subgraph` becomes
one private function per region in the torch stage, called at every use; results
and gradients against eager, and a compile time that does not grow with the uses.
"""

import copy
import time

import torch
import torch.nn.functional as F
from filecheck.matcher import Matcher
from filecheck.options import Options as FileCheckOptions

import tori
from tori.testing import assert_matches_eager, count_graphs

ERROR = {"fallback": "error"}
# Gradients through four LayerNorms differ from eager by float32 rounding (about 2e-5),
# with or without the region.
GRAD_TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}


class Block(torch.nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    @torch.compiler.nested_compile_region
    def forward(self, x):
        return self.norm(F.gelu(self.linear(x)))


class Stack(torch.nn.Module):
    def __init__(self, blocks: int, width: int = 32):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def filecheck(ir: str, checks: str, tmp_path, name: str = "torch") -> None:
    """Run FileCheck `checks` over `ir`; its report goes to the captured stderr."""
    checks_file, ir_file = tmp_path / f"{name}.checks", tmp_path / f"{name}.mlir"
    checks_file.write_text(checks)
    ir_file.write_text(ir)
    matcher = Matcher.from_opts(FileCheckOptions(match_filename=str(checks_file), input_file=str(ir_file)))
    assert matcher.run() == 0, f"FileCheck failed on the {name} IR (report in the captured stderr):\n{ir}"


def one_region_called(times: int) -> str:
    """Checks: @main calls one private function `times` times; it is the only other function."""
    return f"""
CHECK-NOT: func.func private
CHECK: func.func @main(
CHECK: call @[[REGION:[a-z0-9_]+]](
CHECK-COUNT-{times - 1}: call @[[REGION]](
CHECK-NOT: call
CHECK: func.func private @[[REGION]](
CHECK-NOT: call
CHECK-NOT: func.func
"""


def test_region_used_four_times_is_one_private_function_and_four_calls(tmp_path):
    model = Stack(4)
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(8, 32), options=ERROR)
    record = tori.last_compile()
    assert record.forward.kind == "inference"
    filecheck(record.stages["torch"], one_region_called(4), tmp_path)


def test_training_gradients_match_eager_with_forward_and_backward_compiled(tmp_path):
    model = Stack(4)
    reference = copy.deepcopy(model)
    # An input that requires grad makes the four uses one region; AOTAutograd inlines a
    # region used only once, as the first block would be otherwise.
    x = torch.randn(8, 32, requires_grad=True)
    x_reference = x.detach().clone().requires_grad_()
    compiled = torch.compile(model, backend="tori", options=ERROR)
    with count_graphs() as count:
        compiled(x).pow(2).sum().backward()
    reference(x_reference).pow(2).sum().backward()
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0, count.delta
    torch.testing.assert_close(x.grad, x_reference.grad, **GRAD_TOLERANCE)
    for parameter, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(parameter.grad, expected.grad, **GRAD_TOLERANCE)
    record = tori.last_compile()
    filecheck(record.forward.stages["torch"], one_region_called(4), tmp_path, "forward")
    filecheck(record.backward.stages["torch"], one_region_called(4), tmp_path, "backward")


def _first_call_seconds(model: torch.nn.Module, x: torch.Tensor) -> float:
    torch._dynamo.reset()
    # The compile cache off: a hit would leave only Dynamo's tracing to time.
    compiled = torch.compile(model, backend="tori", dynamic=False, options={**ERROR, "cache": False})
    start = time.perf_counter()
    with torch.no_grad():
        compiled(x)
    return time.perf_counter() - start


def test_compile_time_does_not_grow_with_the_number_of_uses():
    x = torch.randn(8, 32)
    _first_call_seconds(Stack(2), x)  # the first compile in a process also pays for imports
    # The fastest of two tries each, so that a busy neighbour cannot make the ratio.
    t1 = min(_first_call_seconds(Stack(1), x) for _ in range(2))
    t12 = min(_first_call_seconds(Stack(12), x) for _ in range(2))
    assert tori.last_compile().stages["torch"].count("call @") == 12
    # Linear growth would be about 12x; one imported body and IREE's deduplicated
    # dispatches keep it near 1.5x on 2 cores.
    assert t12 < 4 * t1, f"first call with 1 block {t1:.2f} s, with 12 blocks {t12:.2f} s"


@torch.compiler.nested_compile_region
def _mlp(x, w1, w2):
    return torch.relu(x @ w1) @ w2


@torch.compiler.nested_compile_region
def _gate(x, w):
    return torch.sigmoid(x @ w) * x


def _two_regions(x, w1, w2, w):
    for _ in range(2):
        x = _gate(_mlp(x, w1, w2), w)
    return x


def test_two_regions_are_two_private_functions(tmp_path):
    with torch.no_grad():
        assert_matches_eager(_two_regions, *(torch.randn(16, 16) for _ in range(4)), options=ERROR)
    filecheck(tori.last_compile().stages["torch"], """
CHECK: func.func @main(
CHECK: call @[[MLP:[a-z0-9_]+]](
CHECK: call @[[GATE:[a-z0-9_]+]](
CHECK: call @[[MLP]](
CHECK: call @[[GATE]](
CHECK-NOT: call
CHECK: func.func private @[[MLP]](
CHECK: torch.aten.relu
CHECK: func.func private @[[GATE]](
CHECK: torch.aten.sigmoid
CHECK-NOT: func.func
""", tmp_path)


class MaskedBlock(torch.nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    @torch.compiler.nested_compile_region
    def forward(self, x, mask):
        return torch.tanh(self.linear(x)) * mask


class MaskedStack(torch.nn.Module):
    def __init__(self, blocks: int = 3, width: int = 16):
        super().__init__()
        self.blocks = torch.nn.ModuleList(MaskedBlock(width) for _ in range(blocks))
        self.register_buffer("mask", (torch.rand(width) > 0.5).float())

    def forward(self, x):
        for block in self.blocks:
            x = block(x, self.mask)
        return x


def test_backward_region_returning_none_for_an_input_without_grad(tmp_path):
    model = MaskedStack()
    reference = copy.deepcopy(model)
    x = torch.randn(4, 16, requires_grad=True)
    compiled = torch.compile(model, backend="tori", options=ERROR)
    with count_graphs() as count:
        compiled(x).sum().backward()
    reference(x.detach().requires_grad_()).sum().backward()
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0, count.delta
    for parameter, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(parameter.grad, expected.grad)
    # The mask's gradient is None: a !torch.none result of the backward region.
    filecheck(tori.last_compile().backward.stages["torch"], """
CHECK: func.func private @{{[a-z0-9_]+}}({{.*}}) -> ({{.*}}!torch.none)
""", tmp_path)


@torch.compiler.nested_compile_region
def _rows_scaled(x, y):
    return torch.cat([x, y]).sin() * x.shape[0]


def test_dynamic_shapes_pass_sizes_to_the_region():
    def fn(x, y):
        return _rows_scaled(x, y) + _rows_scaled(x + 1, y)

    compiled = torch.compile(fn, backend="tori", dynamic=True, options=ERROR)
    with torch.no_grad(), count_graphs() as count:
        for rows in (5, 8):
            x, y = torch.randn(rows, 3), torch.randn(rows + 1, 3)
            torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert count.compiled_graphs == 1 and count.fallback_calls == 0, count.delta
    torch_ir = tori.last_compile().stages["torch"]
    assert "func.func private" in torch_ir and "!torch.int" in torch_ir


@torch.compiler.nested_compile_region
def _inner(x, w):
    return torch.tanh(x @ w)


@torch.compiler.nested_compile_region
def _outer(x, w):
    return _inner(_inner(x, w), w) + 1


def test_nested_regions_call_each_other(tmp_path):
    with torch.no_grad():
        assert_matches_eager(lambda x, w: _outer(_outer(x, w), w), torch.randn(4, 4), torch.randn(4, 4), options=ERROR)
    filecheck(tori.last_compile().stages["torch"], """
CHECK: func.func @main(
CHECK-COUNT-2: call @[[OUTER:[a-z0-9_]+]](
CHECK: func.func private @[[OUTER]](
CHECK-COUNT-2: call @[[INNER:[a-z0-9_]+]](
CHECK: func.func private @[[INNER]](
CHECK-NOT: func.func
""", tmp_path)
