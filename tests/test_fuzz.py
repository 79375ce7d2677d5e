"""Differential fuzzing against eager: hypothesis generates small random programs
(tori.fuzz), tori compiles them in batches (fallback='error'), and every program must
compile and every output match eager (a refusal fails unless allow-listed below). A
fixed seed and budget here; `make fuzz` runs a larger budget.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from tori.fuzz.check import Summary, Verdict, check, mismatch, unsettled_values
from tori.fuzz.modes import Mode
from tori.fuzz.program import build
from tori.fuzz.program import InputSpec, Node, Program

# Batches of up to 8 programs per mode at the default seed (values 12, gradients,
# dynamic shapes and export 4 each), about 75 s in all in CI on 2 cores. `make fuzz`
# runs 100 batches per mode and seed, 3 seeds.
BATCHES = {"values": 12, "gradients": 4, "dynamic": 4, "export": 4}
SEED = int(os.environ.get("TORI_FUZZ_SEED", "20261129"))
SCALE = float(os.environ.get("TORI_FUZZ_SCALE", "1"))

# Programs of the CI budget at the default seed that tori may refuse, by Program.key(),
# each with its cause. Any other refusal, crash or timeout, any wrong value fails the
# test. Empty: at the default seed every program compiles and matches eager.
ALLOWED_REFUSALS: dict[str, str] = {}
DEFAULT_RUN = SEED == 20261129 and SCALE == 1


def _report(found: dict) -> str:
    return f"{found['verdict']} [{found['key']}]: {found['detail']}\n{found['reproducer']}"


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(BATCHES))
def test_fuzzed_programs_match_eager(tmp_path, mode):
    # In a process of its own: which programs a seed draws must not depend on what the
    # test session imported before (the OpInfo database's import changed them).
    result = tmp_path / "fuzz.json"
    batches = max(1, round(BATCHES[mode] * SCALE))
    done = subprocess.run([sys.executable, "-m", "tori.fuzz", "--modes", mode, "--seeds", str(SEED),
                           "--batches", str(batches), "--no-shrink", "--json", str(result)],
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "TORI_CACHE_DIR": str(tmp_path / "cache")})
    assert result.exists(), f"the fuzz run ended without a result (exit {done.returncode}):\n{done.stderr[-4000:]}"
    found = json.loads(result.read_text())["modes"][mode]
    print(found["line"])
    assert found["programs"] >= batches, found["line"]  # the budget ran
    assert found["verdicts"]["match"] >= 0.9 * found["programs"], found["line"]
    wrong = [o for o in found["not_matching"] if o["verdict"] in ("wrong", "crash")]
    assert not wrong, "\n\n".join(map(_report, wrong))
    refused = [o for o in found["not_matching"] if o["verdict"] == "refused" and o["key"] not in ALLOWED_REFUSALS]
    assert not refused, (f"{len(refused)} programs refused (a CompileError: a missing lowering, iree-compile "
                         f"dying or timing out, an exception in a decomposition); fix them, or allow-list a "
                         f"program in ALLOWED_REFUSALS with its cause:\n\n" + "\n\n".join(map(_report, refused)))
    if DEFAULT_RUN and mode == "values":  # an allowed refusal that compiles now leaves the list
        stale = set(ALLOWED_REFUSALS) - {o["key"] for o in found["not_matching"] if o["verdict"] == "refused"}
        assert not stale, f"allow-listed programs that no longer are refused: remove {sorted(stale)}"
    assert found["longest_batch_s"] < 60, found["line"]
    if mode == "dynamic":  # sizes called often got static-shape variants, the others ran the dynamic module
        assert found["shape_variants"] >= batches // 2, found
    assert done.returncode == 0, done.stdout[-4000:]


def test_a_refusal_fails_the_fuzz_test():
    # The check the fuzz test relies on: a program tori refuses (general eigenvalues
    # have no formulation in tori) is counted as refused, and kept with its program for
    # the report.
    program = Program(inputs=(InputSpec((3, 3), torch.float32),),
                      nodes=(Node("v0", "unary", "torch.linalg.eigvals(x0).abs()"),))
    fresh = Summary()
    (outcome,) = check([program], fresh)
    assert outcome.verdict is Verdict.REFUSED, outcome.detail
    assert fresh.refused == [outcome] and fresh.verdicts[Verdict.REFUSED] == 1
    assert len(program.key()) == 12 and program.key() == Program(program.inputs, program.nodes).key()


def test_nan_reaches_max_min_and_clamp():
    # The fuzzer's first finding, reduced: IREE's float maximum/minimum/clamp dropped
    # a NaN first operand; tori decomposes them so that NaN propagates as in eager.
    nan = float("nan")
    program = Program(
        inputs=(InputSpec((4,), torch.float16, specials=(nan,)), InputSpec((4,), torch.float32, specials=(nan, nan))),
        nodes=(Node("v0", "binary", "torch.maximum(x0, x1)"), Node("v1", "binary", "torch.minimum(x1, x0)"),
               Node("v2", "clamp", "torch.clamp(x0, min=0, max=1)"), Node("v3", "clamp", "torch.relu(x1)"),
               Node("v4", "clamp", "torch.nn.functional.hardtanh(x1)")),
    )
    fresh = Summary()
    (outcome,) = check([program], fresh)
    assert outcome.verdict is Verdict.MATCH, outcome.detail
    assert fresh.compiles == 1


def test_atan2_of_infinities_and_signed_zeros():
    # Reduced from the fuzzer: IREE's atan2 was NaN for two infinities or two zeros and
    # lost the sign of y where y is zero or x infinite; tori's decomposition gives eager's values.
    nan, inf = float("nan"), float("inf")
    program = Program(
        inputs=(InputSpec((8,), torch.float32, specials=(inf, -inf, inf, -inf, 0.0, -0.0, -0.0, nan)),
                InputSpec((8,), torch.float32, specials=(inf, inf, -inf, -inf, -0.0, 0.0, -1.0, 0.0)),
                InputSpec((8,), torch.float16, specials=(-0.0, inf, -2.0, 3.0, -inf))),
        nodes=(Node("v0", "float_binary", "torch.atan2(x0, x1)"), Node("v1", "float_binary", "torch.atan2(x2, x1)")),
    )
    (outcome,) = check([program], Summary())
    assert outcome.verdict is Verdict.MATCH, outcome.detail


def test_nan_compared_with_itself_and_isfinite():
    # Reduced from the fuzzer: isfinite(NaN) was true, because x == x compiled to true.
    nan, inf = float("nan"), float("inf")
    program = Program(
        inputs=(InputSpec((5,), torch.float32, specials=(nan, inf, -inf)), InputSpec((3,), torch.float16, specials=(nan,))),
        nodes=(Node("v0", "float_unary", "torch.isfinite(x0)"), Node("v1", "binary", "torch.eq(x0, x0)"),
               Node("v2", "binary", "torch.ge(x1, x1)"), Node("v3", "binary", "torch.le(x0, x0)"),
               Node("v4", "float_unary", "torch.isfinite(x1)")),
    )
    (outcome,) = check([program], Summary())
    assert outcome.verdict is Verdict.MATCH, outcome.detail


def test_where_of_one_value_broadcasts():
    # Reduced from the fuzzer (refused at the CI seed): Torch-MLIR folded where(c, a, a)
    # to `a` without broadcasting it to c's shape, and iree-compile rejected the result type.
    program = Program(
        inputs=(InputSpec((5,), torch.bool), InputSpec((1, 5), torch.bool)),
        nodes=(Node("v0", "where", "torch.where(x1, x0, x0)"), Node("v1", "cast", "x0.to(torch.bool)"),
               Node("v2", "where", "torch.where(x1, x1, v1)")),
    )
    fresh = Summary()
    (outcome,) = check([program], fresh)
    assert outcome.verdict is Verdict.MATCH, outcome.detail


def program_outputs(program: Program) -> list[torch.Tensor]:
    return list(build(program.function_source(), "program")(*(spec.make() for spec in program.inputs)))


def test_values_that_input_rounding_unsettles_are_not_judged():
    # From `make fuzz` seed 3: a row [0.47, -0.05, -3e38, 3e38] times a column whose
    # last two weights are equal: eager 0.0, tori -1.9e30 (a fused multiply-add keeps the
    # product's rounding error). Both are within rounding of the 1e38 terms; moving the
    # inputs by one float32 rounding moves the exact result that far, so that value is
    # not judged. Values that do not move are still compared.
    spec = InputSpec((2,), torch.float32, specials=(-3e38, 3e38))
    program = Program(inputs=(spec, InputSpec((3,), torch.float32, seed=1)), nodes=(
        Node("v0", "matmul", "x0 @ torch.full((2,), 0.3912186, dtype=x0.dtype)"),
        Node("v1", "binary", "x1 * 2 + 1")))
    cancelled, scaled = unsettled_values(program)
    assert bool(cancelled) is True and not scaled.any()
    eager = program_outputs(program)
    assert mismatch(torch.tensor(-1.9e30), eager[0]) is not None
    assert mismatch(torch.tensor(-1.9e30), eager[0], cancelled) is None
    assert mismatch(eager[1] * 1.01, eager[1], scaled) is not None


def test_bool_compared_with_a_number():
    # Reduced from the fuzzer: False > -1 compiled to False (IREE truncated -1 to a bool).
    program = Program(
        inputs=(InputSpec((), torch.bool, specials=(False,)), InputSpec((4,), torch.bool, seed=3)),
        nodes=(Node("v0", "compare", "x0 > -1"), Node("v1", "compare", "x1 < 0.5"), Node("v2", "compare", "x1 == 1"),
               Node("v3", "compare", "x1 != 2"), Node("v4", "compare", "x1 <= -0.5")),
    )
    (outcome,) = check([program], Summary())
    assert outcome.verdict is Verdict.MATCH, outcome.detail


def test_mismatch_tells_nan_inf_dtype_and_shape_apart():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([1.0, nan, inf])
    assert mismatch(x.clone(), x) is None
    assert "NaN" in mismatch(torch.tensor([1.0, 0.0, inf]), x)
    assert "Inf" in mismatch(torch.tensor([1.0, nan, -inf]), x)
    assert "dtype" in mismatch(x.half(), x)
    assert "shape" in mismatch(x[:2], x)
    assert mismatch(torch.tensor([1.001], dtype=torch.float16), torch.tensor([1.0], dtype=torch.float16)) is None
    assert "beyond" in mismatch(torch.tensor([1.001]), torch.tensor([1.0]))
    assert "differ" in mismatch(torch.tensor([1, 2]), torch.tensor([1, 3]))


def test_a_refused_op_is_counted_apart_from_wrong_results():
    # torch.linalg.ldl_factor_ex has no IREE lowering: refused, which is neither a match nor a failure.
    program = Program(inputs=(InputSpec((3,), torch.float32),),
                      nodes=(Node("v0", "float_binary", "torch.linalg.ldl_factor_ex(torch.diag(x0.abs() + 1))[0]"),))
    fresh = Summary()
    (outcome,) = check([program], fresh)
    assert outcome.verdict is Verdict.REFUSED and "ldl_factor" in outcome.detail
    assert fresh.verdicts[Verdict.WRONG] == 0 and fresh.verdicts[Verdict.CRASH] == 0


def test_eager_nan_that_float64_does_not_give_is_not_held_against_tori():
    # From `make fuzz` (values, seed 3): eager's float32 gelu(inf) is NaN in its vector
    # kernel (two elements or more), inf on one element and in float64; tori's is inf.
    inf = float("inf")
    program = Program(inputs=(InputSpec((2,), torch.float32, specials=(inf,)),),
                      nodes=(Node("v0", "float_unary", "torch.nn.functional.gelu(x0)"),))
    (outcome,) = check([program], Summary())
    assert outcome.verdict is Verdict.MATCH, outcome.detail
    # A NaN that float64 does give must still be matched.
    assert mismatch(torch.tensor([inf]), torch.tensor([float("nan")]), exact=torch.tensor([float("nan")])) is not None
    assert mismatch(torch.tensor([inf]), torch.tensor([float("nan")]), exact=torch.tensor([inf], dtype=torch.float64)) is None


def test_a_gradient_that_eager_takes_another_formula_for_is_judged_by_the_traced_one():
    # From `make fuzz` (gradients, seed 3): prod of [1e20, nan]; eager's backward divides
    # the product by each element (NaN), AOTAutograd's traced one multiplies the others
    # (1e20), and so does tori. Judged by the traced formula, it matches; a value that
    # both formulas give differently from tori would not.
    nan = float("nan")
    program = Program(inputs=(InputSpec((2,), torch.float32, specials=(1e20, nan)),),
                      nodes=(Node("v0", "reduction", "torch.prod(x0, dim=-1)"),))
    (outcome,) = check([program], Summary(), Mode.GRADIENTS)
    assert outcome.verdict is Verdict.MATCH, outcome.detail
    assert outcome.program.result_names() == ["v0"]
