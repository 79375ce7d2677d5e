"""The core pipeline end to end: registration, options, stages, fallback and
error paths, graph breaks, inference, dynamic shapes and driver choice."""

import logging
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import tori
import tori.passes
from torch_mlir import ir
from tori.config import DEFAULT_PIPELINE, Fallback, Options, from_environment
from tori.runtime.compiled_graph import (DECISIVE_CALLS, LOCAL_TASK_MARGIN, MARGIN_BELOW_SECONDS,
                                         SETTLED_AFTER_CALLS, TRIAL_BLOCK_CALLS, TRIAL_CALLS_PER_DRIVER)
from tori.errors import CompileError, OptionsError, UnsupportedOpError
from tori.stages import STAGES, Stage
from tori.testing import assert_matches_eager, count_graphs, settle_batch_norm


def _unsupported(x):
    # aten.linalg_ldl_factor_ex has no lowering in Torch-MLIR/IREE and no decomposition in tori.
    return torch.linalg.ldl_factor_ex(x @ x.mT + 1)[0] * 2 + 1


def _run_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORI_")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_backend_is_registered_in_a_fresh_interpreter_without_import():
    done = _run_python(
        "import sys, torch\n"
        "assert 'tori' in torch.compiler.list_backends()\n"
        "f = torch.compile(lambda x: x * 3 + 1, backend='tori')\n"
        "print(f(torch.ones(2)).tolist())\n"
        "from tori import counters\n"
        "print(counters.compiled_graphs, counters.compiled_calls)\n"
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "[4.0, 4.0]"
    assert lines[1] == "1 1"


def test_interpreter_exit_is_clean_after_running_compiled_code():
    done = _run_python(
        "import torch\n"
        "f = torch.compile(lambda x: x.sin(), backend='tori')\n"
        "f(torch.ones(3))\n"
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr


@pytest.mark.parametrize("options, what", [
    ({"bogus": 1}, "tori option"),
    ({"fallback": "maybe"}, "fallback"),
    ({"target": "tpu"}, "target"),
    ({"driver": "cuda-ish"}, "driver"),
])
def test_bad_options_name_the_valid_values(options, what):
    with pytest.raises(OptionsError) as raised:
        torch.compile(lambda x: x + 1, backend="tori", options=options)(torch.ones(2))
    assert raised.value.what == what
    assert raised.value.valid and all(v in str(raised.value) for v in raised.value.valid)


def test_tori_compile_validates_options_before_the_first_call():
    with pytest.raises(OptionsError, match="unknown tori option 'nope'; one of: target, ") as raised:
        tori.compile(lambda x: x, options={"nope": True})
    assert {"fallback", "pipeline", "specialize_shapes"} <= set(raised.value.valid)


def test_options_from_environment():
    options = from_environment({"TORI_FALLBACK": "error", "TORI_IREE_FLAGS": "--a --b", "TORI_DRIVER": "local-sync"})
    assert options.fallback is Fallback.ERROR
    assert options.iree_flags == ("--a", "--b")
    assert options.driver.value == "local-sync"
    with pytest.raises(OptionsError, match="unknown fallback .*; one of: eager, error"):
        from_environment({"TORI_FALLBACK": "sometimes"})
    assert Options.from_mapping({"fallback": "error"}, base=Options()).fallback is Fallback.ERROR
    assert from_environment({"TORI_PIPELINE": ""}).pipeline == ""
    assert from_environment({"TORI_FALLBACK": ""}).fallback is Fallback.EAGER
    assert from_environment({}).pipeline is None and from_environment({}).tori_pipeline == DEFAULT_PIPELINE


def test_iree_flags_from_a_string_a_json_list_or_a_sequence_and_only_flags():
    assert Options.from_mapping({"iree_flags": '["--a", "--b=1"]'}, base=Options()).iree_flags == ("--a", "--b=1")
    assert Options.from_mapping({"iree_flags": ["--a"]}, base=Options()).iree_flags == ("--a",)
    # iree-compile would read a word that is not a flag as a second input file.
    with pytest.raises(OptionsError, match="invalid iree_flags item 'x': each item is one iree-compile flag"):
        Options.from_mapping({"iree_flags": '["x"]'}, base=Options())
    with pytest.raises(OptionsError, match="expected a JSON list of flags.*It does not parse"):
        Options.from_mapping({"iree_flags": '["--a"'}, base=Options())
    with pytest.raises(OptionsError, match="invalid iree_flags 5"):
        Options.from_mapping({"iree_flags": 5}, base=Options())
    # Flags that let a dispatch outgrow the 128 KiB stacks of IREE's worker threads.
    with pytest.raises(OptionsError, match="'--iree-llvmcpu-fail-on-large-vector=false' is refused: IREE's check"):
        Options.from_mapping({"iree_flags": ["--iree-llvmcpu-fail-on-large-vector=false"]}, base=Options())
    with pytest.raises(OptionsError, match="allocate 131072 bytes on the stack"):
        Options.from_mapping({"iree_flags": "--iree-llvmcpu-stack-allocation-limit=131072"}, base=Options())
    assert Options.from_mapping({"iree_flags": ["--iree-llvmcpu-stack-allocation-limit=65536",
                                                "--iree-llvmcpu-fail-on-large-vector=true"]},
                                base=Options()).iree_flags[0].endswith("65536")


def test_a_misspelt_environment_variable_is_named_with_the_one_meant():
    with pytest.warns(UserWarning, match="environment variable TORI_CACHE_MAX_BYTES is not one tori reads "
                                         r"\(ignored\); did you mean TORI_CACHE_MAX_SIZE\?"):
        options = from_environment({"TORI_CACHE_MAX_BYTES": "1K", "TORI_FALLBACK": "error"})
    assert options.fallback is Fallback.ERROR and options.cache_max_bytes == Options().cache_max_bytes
    with pytest.warns(UserWarning, match="TORI_NOTHING_LIKE_IT is not one tori reads .*; the README lists"):
        from_environment({"TORI_NOTHING_LIKE_IT": "1"})


def test_every_stage_is_kept_in_order():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh())
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(2, 4))
    record = tori.last_compile()
    assert list(record.stages) == list(STAGES)
    assert "linear" in record.stages["dynamo"] or "l__self___0" in record.stages["dynamo"].lower()
    assert "aten.mm" in record.stages["aten"] or "aten.addmm" in record.stages["aten"]
    assert "torch.aten.tanh" in record.stages["torch"]
    assert "func.func @main" in record.stages[Stage.TORI]
    assert "--iree-input-type=torch" in record.stages["iree"]
    assert record.stages["vmfb"][:8] and len(record.stages["vmfb"]) > 1000
    assert record.forward.kind == "inference"
    with pytest.raises(KeyError, match="not reached"):
        tori.GraphRecord("g", "forward").stages["vmfb"]


def test_training_keeps_forward_and_backward_stages():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})
    with count_graphs() as count:
        compiled(torch.randn(5, 4)).sum().backward()
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0
    record = tori.last_compile()
    assert record.forward.kind == "forward" and record.backward is not None
    assert "torch.aten" in record.backward.stages["torch"]
    assert all(p.grad is not None for p in model.parameters())


def test_fallback_to_eager_warns_once_with_stage_op_and_repro(tmp_path, caplog):
    x = torch.randn(3, 5)
    # Without partial fallback, which would compile the graph around the op (test_partition.py).
    compiled = torch.compile(_unsupported, backend="tori", options={"repro_dir": str(tmp_path), "partition": False})
    with caplog.at_level(logging.WARNING, logger="tori"), count_graphs() as count:
        result = compiled(x)
        compiled(x)
    torch.testing.assert_close(result, _unsupported(x))
    assert count.compiled_graphs == 0 and count.fallback_graphs == 1
    assert count.fallback_calls == 2 and count.compiled_calls == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("tori")]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "stage 'iree'" in message and "torch.aten.linalg_ldl_factor_ex" in message and "iree-compile" in message
    repro = tori.last_compile().forward.error.repro
    assert repro.parent == tmp_path and "torch.aten.linalg_ldl_factor_ex" in repro.read_text()


def test_fallback_error_raises_compile_error_whose_command_reproduces(tmp_path):
    compiled = torch.compile(_unsupported, backend="tori", options={"fallback": "error", "repro_dir": str(tmp_path)})
    with pytest.raises(CompileError) as raised:
        compiled(torch.randn(3, 5))
    error = raised.value
    assert isinstance(error, UnsupportedOpError)
    assert error.stage == "iree" and error.op == "torch.aten.linalg_ldl_factor_ex"
    assert error.repro.exists() and error.repro.with_suffix(".txt").exists()
    assert "reproduce with" in str(error) and "what to do" in str(error)
    done = subprocess.run(error.command, shell=True, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]})
    assert done.returncode != 0 and "torch.aten.linalg_ldl_factor_ex" in done.stderr


def test_import_stage_failure_falls_back_and_names_the_stage(tmp_path):
    def branchy(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    x = torch.randn(4)
    compiled = torch.compile(branchy, backend="tori", options={"repro_dir": str(tmp_path), "partition": False})
    with count_graphs() as count:
        torch.testing.assert_close(compiled(x), branchy(x))
    assert count.fallback_graphs == 1 and count.fallback_calls == 1
    error = tori.last_compile().forward.error
    assert error.stage == "torch" and "cond" in error.op
    assert error.repro.exists()


def test_graph_break_compiles_each_graph():
    def two_graphs(x):
        y = torch.relu(x) * 2
        torch._dynamo.graph_break()
        return y.sum(dim=0) + x.mean()

    before = tori.compile_records()  # the records kept are the last 256: compare records, not counts
    assert_matches_eager(two_graphs, torch.randn(4, 3), fullgraph=False)  # the break is the point
    assert len([r for r in tori.compile_records() if not any(r is b for b in before)]) == 2


def test_several_graphs_in_one_function_with_data_dependent_branch():
    def branch(x):
        if x.sum() > 0:  # a graph break: Dynamo cannot trace a tensor-valued condition
            return x * 2
        return x - 1

    compiled = torch.compile(branch, backend="tori", options={"fallback": "error"})
    with count_graphs() as count:
        for x in (torch.ones(3), -torch.ones(3)):
            torch.testing.assert_close(compiled(x), branch(x))
    assert count.compiled_graphs >= 2 and count.fallback_graphs == 0


def test_no_grad_inference_compiles_an_inference_graph():
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.GELU())
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(2, 6))
    assert tori.last_compile().forward.kind == "inference"
    assert tori.last_compile().backward is None


def test_dynamic_true_compiles_once_across_sizes():
    def f(x, w):
        return torch.softmax(x @ w, dim=-1).sum(dim=0)

    compiled = torch.compile(f, backend="tori", dynamic=True, options={"fallback": "error"})
    w = torch.randn(5, 3)
    with count_graphs() as count:
        for rows in (2, 3, 7, 16):
            x = torch.randn(rows, 5)
            torch.testing.assert_close(compiled(x, w), f(x, w))
    assert count.compiled_graphs == 1 and count.compiled_calls == 4
    assert "[?,?],f32" in tori.last_compile().stages["torch"]


def test_mark_dynamic_batch_compiles_once():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})
    with torch.no_grad(), count_graphs() as count:
        for batch in (2, 5, 9):
            x = torch.randn(batch, 4)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(compiled(x), model(x))
    assert count.compiled_graphs == 1 and count.compiled_calls == 3
    assert "!torch.vtensor<[?,4],f32>" in tori.last_compile().stages["torch"]


def test_dynamic_training_stays_correct_across_sizes():
    model = torch.nn.Linear(3, 2)
    reference = torch.nn.Linear(3, 2)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tori", dynamic=True, options={"fallback": "error"})
    with count_graphs() as count:
        for batch in (2, 4, 6):
            x = torch.randn(batch, 3)
            compiled(x).square().sum().backward()
            reference(x).square().sum().backward()
    torch.testing.assert_close(model.weight.grad, reference.weight.grad)
    torch.testing.assert_close(model.bias.grad, reference.bias.grad)
    assert count.fallback_graphs == 0 and count.compiled_graphs == 2


def test_driver_is_chosen_by_measurement_and_recorded():
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    for _ in range(1 + 2 * TRIAL_CALLS_PER_DRIVER):  # the first call untimed, then the trial's
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    # The last timed call's period ends when the next call starts: that call settles.
    assert tori.last_compile().forward.compiled.driver_choice is None
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    choice = tori.last_compile().forward.compiled.driver_choice
    assert choice.driver in ("local-sync", "local-task")
    assert set(choice.median_us) == {"local-sync", "local-task"}
    assert choice.driver == _by_the_rule(choice.median_us)
    assert "median of 4 timed calls" in choice.reason and not choice.final
    # A second round after REVIEW_AFTER_CALLS calls makes the choice final, over both rounds.
    for _ in range(SETTLED_AFTER_CALLS - (1 + 2 * TRIAL_CALLS_PER_DRIVER + 1)):
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    final = tori.last_compile().forward.compiled.driver_choice
    assert final.final and "median of 8 timed calls" in final.reason
    assert final.driver == _by_the_rule(final.median_us)


def test_driver_trial_runs_each_driver_in_blocks_of_calls():
    """A round's calls run in blocks of TRIAL_BLOCK_CALLS on one driver, the blocks
    alternating, and the first call of each block is not counted: calls alternating one
    by one read the two modules' copies of the weights in turn, which no stretch on one
    driver does."""
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    compiled(x)  # the first call, untimed
    graph = tori.last_compile().forward.compiled
    run, drivers = graph._run, []

    def logged(module, args):
        drivers.append(module.driver)
        return run(module, args)

    graph._run = logged
    while graph.driver_choice is None:
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    block = TRIAL_BLOCK_CALLS
    expected = (["local-sync"] * block + ["local-task"] * block) * (TRIAL_CALLS_PER_DRIVER // block)
    assert drivers[:len(expected)] == expected and block > 1
    counted = TRIAL_CALLS_PER_DRIVER - TRIAL_CALLS_PER_DRIVER // block
    assert f"median of {counted} timed calls" in graph.driver_choice.reason


def test_first_call_loads_and_runs_one_driver():
    """A graph's first call runs untimed on the CPU's first-calls driver (local-task: its
    threads give one call its shortest time) with only that driver's module loaded; the
    next call loads local-sync's, with the same resident weights, before the trial."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})
    x = torch.randn(4, 64)
    before = tori.counters.snapshot()
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(compiled(x), model(x))
        graph = tori.last_compile().graphs[0].compiled
        assert graph._resident and set(graph._modules) == {"local-task"} and graph._timed is None
        assert tori.counters.since(before).compiled_calls == 1
        torch.testing.assert_close(compiled(x), model(x))
        assert set(graph._modules) == {"local-sync", "local-task"}
        while graph.driver_choice is None:  # every trial call on both drivers, weights and all
            torch.testing.assert_close(compiled(x), model(x))
    assert count.fallback_calls == 0 and set(graph.driver_choice.median_us) == {"local-sync", "local-task"}


def _by_the_rule(median_us: dict[str, float]) -> str:
    """The driver the trial's medians choose: the fastest, but local-task's short calls only
    by LOCAL_TASK_MARGIN."""
    sync, task = median_us["local-sync"], median_us["local-task"]
    if task < sync and (task >= MARGIN_BELOW_SECONDS * 1e6 or task * LOCAL_TASK_MARGIN <= sync):
        return "local-task"
    return "local-sync"


@pytest.mark.parametrize("sync_ms, task_ms, chosen", [(16, 10, "local-task"), (10, 16, "local-sync"),
                                                      (30, 24, "local-task")])
def test_the_driver_with_the_shorter_periods_is_chosen(sync_ms, task_ms, chosen):
    """Calls whose periods (the call and the caller's work after it) are far apart on the
    two drivers choose the shorter: 1.6x for short calls, 1.25x for long ones. (How close
    periods decide is `test_local_task_wins_short_calls_only_by_the_margin`'s: a loaded
    machine's sleeps on local-task's calls measured 2 ms longer than on local-sync's.)"""
    fn = {"16": lambda x: x * 7 - 3, "10": lambda x: x * 5 - 2, "30": lambda x: x * 9 - 4}[str(sync_ms)]
    compiled = torch.compile(fn, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    compiled(x)  # the first call, untimed
    compiled(x)  # the first trial call, a warm-up
    graph = tori.last_compile().forward.compiled
    run = graph._run

    def slowed(module, args):  # each call's period: the call and the caller's work after it
        time.sleep((sync_ms if module.driver == "local-sync" else task_ms) / 1e3)
        return run(module, args)

    graph._run = slowed
    for _ in range(2 * TRIAL_CALLS_PER_DRIVER):
        torch.testing.assert_close(compiled(x), fn(x))
    choice = graph.driver_choice
    assert choice.driver == chosen, choice.reason
    assert choice.median_us["local-sync"] >= sync_ms * 1000 and choice.median_us["local-task"] >= task_ms * 1000


@pytest.mark.parametrize("sync_ms, task_ms, chosen", [(10.5, 10, "local-sync"), (11.5, 10, "local-task"),
                                                      (26, 25, "local-task"), (25, 26, "local-sync")])
def test_local_task_wins_short_calls_only_by_the_margin(sync_ms, task_ms, chosen):
    """A round's medians decide: under MARGIN_BELOW_SECONDS local-task only where its
    median is LOCAL_TASK_MARGIN times shorter (5% keeps local-sync, 15% chooses local-task);
    longer calls by any gap."""
    compiled = torch.compile(lambda x: x * 3 + 2, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    compiled(x)  # the first call, untimed: one driver's module loaded
    graph = tori.last_compile().forward.compiled
    for driver in graph._drivers:
        graph._module(driver)
    per_round = TRIAL_CALLS_PER_DRIVER
    graph._timings = {"local-sync": [sync_ms / 1e3] * per_round, "local-task": [task_ms / 1e3] * per_round}
    graph._settle()
    assert graph.driver_choice.driver == chosen == _by_the_rule(graph.driver_choice.median_us)
    assert LOCAL_TASK_MARGIN > 1.05 and 11.5 / 10 >= LOCAL_TASK_MARGIN and 25e-3 >= MARGIN_BELOW_SECONDS
    torch.testing.assert_close(compiled(x), x * 3 + 2)


def test_driver_trial_times_each_call_until_the_next_one_starts():
    """A driver whose calls return quickly but leave the caller's next steps slower
    loses: the period from a call to the next decides, not the call alone."""
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    compiled(x)  # the first call, untimed
    compiled(x)  # the first timed call (local-sync, by the order of the trial)
    graph = tori.last_compile().forward.compiled
    assert graph._timed is not None and graph._timed[0] == "local-sync"
    for _ in range(2 * TRIAL_CALLS_PER_DRIVER):
        driver = graph._timed[0]
        if driver == "local-task":
            time.sleep(0.005)  # after each local-task call, the caller's own work takes longer
        compiled(x)
    choice = graph.driver_choice
    assert choice.driver == "local-sync", choice.reason
    assert choice.median_us["local-task"] >= 5000 > choice.median_us["local-sync"]


def test_driver_trial_leaves_out_other_graphs_trial_calls():
    """Two graphs called in turn, their trials one call apart: each graph's period holds
    the other's trial call, on the other driver. Those calls are not counted, so a
    graph slow on one driver decides only its own choice."""
    first = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    second = torch.compile(lambda x: x * 3 - 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    first(x)  # its trial starts a call before the second's
    a = tori.last_compile().forward.compiled
    second(x)
    b = tori.last_compile().forward.compiled
    slow_task = b._modules["local-task"]
    run = b._run

    def slow_on_local_task(module, args):  # the second graph's local-task calls take 50 ms
        if module is slow_task:
            time.sleep(0.05)
        return run(module, args)

    b._run = slow_on_local_task
    for _ in range(2 * TRIAL_CALLS_PER_DRIVER + 1):
        torch.testing.assert_close(first(x), x * 2 + 1)
        torch.testing.assert_close(second(x), x * 3 - 1)
    assert b.driver_choice.driver == "local-sync", b.driver_choice.reason
    assert b.driver_choice.median_us["local-task"] >= 50_000
    # Without that, the first graph's periods on one driver held the second's slow calls.
    assert max(a.driver_choice.median_us.values()) < 25_000, a.driver_choice.reason


def test_a_decisive_gap_between_long_calls_settles_the_driver_early():
    """Calls of 20 ms or more where one driver is 1.5x faster or more: after two timed
    calls each the choice is final, without the rest of the trial or the review."""
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    compiled(x)  # the first call, untimed
    compiled(x)
    graph = tori.last_compile().forward.compiled
    calls = 2
    while graph.driver_choice is None:
        if graph._timed[0] == "local-sync":
            time.sleep(0.05)  # the caller's work after each local-sync call takes 50 ms
        torch.testing.assert_close(compiled(x), x * 2 + 1)
        calls += 1
    choice = graph.driver_choice
    # After the untimed first call, three calls each (the first a warm-up), settled by the
    # start of the eighth.
    assert calls == 1 + 2 * (DECISIVE_CALLS + 1) + 1, calls
    assert choice.driver == "local-task" and choice.final, choice.reason
    assert "decided for good" in choice.reason and "median of 2 timed calls" in choice.reason
    assert choice.median_us["local-sync"] >= 50_000 > choice.median_us["local-task"]
    assert graph._call == graph._call_active


def test_driver_option_pins_the_driver():
    assert_matches_eager(lambda x: x.exp(), torch.randn(4), options={"driver": "local-task"}, calls=2)
    choice = tori.last_compile().forward.compiled.driver_choice
    assert choice.driver == "local-task" and "option" in choice.reason


def test_dump_dir_writes_every_stage(tmp_path):
    # No compile cache: iree-compile runs, and the dump keeps the exact module it was given.
    assert_matches_eager(lambda x: x.exp(), torch.randn(4), options={"dump_dir": str(tmp_path), "cache": False})
    (graph_dir,) = tmp_path.iterdir()
    names = sorted(p.name for p in graph_dir.iterdir())
    assert names == ["00-dynamo.py", "01-aten.py", "02-torch.mlir", "03-tori.mlir", "04-iree-input.mlir",
                     "05-iree.sh", "06-vmfb.vmfb", f"{graph_dir.name}.mlirbc", "index.json"]
    assert "torch.aten.exp" in (graph_dir / "02-torch.mlir").read_text()
    # The iree-compile script compiles the exact module iree-compile was given, kept in the dump.
    script = (graph_dir / "05-iree.sh").read_text()
    assert f"{graph_dir.name}.mlirbc" in script
    (graph_dir / "06-vmfb.vmfb").rename(graph_dir / "dumped.vmfb")
    done = subprocess.run(["sh", str(graph_dir / "05-iree.sh")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (graph_dir / f"{graph_dir.name}.vmfb").stat().st_size > 1000


def test_iree_compile_runs_as_phases_that_verify_what_they_read():
    # Three processes in a pipe: the input conversion verified after every pass, the
    # later phases verified as each parses the module the one before it wrote (a module
    # of a few ops: no executable groups, tests/test_executable_groups.py).
    assert_matches_eager(lambda x: x.exp() * 2, torch.randn(4), options={"cache": False})
    phases = tori.last_compile().graphs[0].stages["iree"].split(" | ")
    assert len(phases) == 3
    assert "--compile-to=input" in phases[0] and "--verify" not in phases[0]
    assert "--compile-to=executable-configurations" in phases[1] and "--verify=false" in phases[1]
    assert "--compile-from=executable-configurations" in phases[2] and "--verify=false" in phases[2]
    assert all(" - " in phase or phase.endswith(" -") for phase in phases[1:])  # each reads the pipe
    # A user's own --verify makes it one process with exactly the user's flags.
    assert_matches_eager(lambda x: x.exp() * 3, torch.randn(4), options={"cache": False, "iree_flags": "--verify=true"})
    command = tori.last_compile().graphs[0].stages["iree"]
    assert " | " not in command and "--verify=true" in command and "--compile-to" not in command


# Positions folded to a signed-integer resource blob, as tori folded GPT-2's before it
# wrote integers inline: IREE's input conversion makes a signless copy of the blob that
# iree-compile cannot write as bytecode ("cannot serialize resource").
SIGNED_RESOURCE = """
module {
  "util.global"() {initial_value = #stream.parameter.named<"model"::"table"> : tensor<16x4xf32>, sym_name = "table", sym_visibility = "private", type = tensor<16x4xf32>} : () -> ()
  func.func @main(%arg0: !torch.vtensor<[1,8,4],f32>) -> !torch.vtensor<[1,8,4],f32> {
    %0 = torch.vtensor.literal(dense_resource<positions> : tensor<1x8xsi64>) : !torch.vtensor<[1,8],si64>
    %1 = "util.global.load"() {global = @table} : () -> tensor<16x4xf32>
    %2 = "torch_c.from_builtin_tensor"(%1) : (tensor<16x4xf32>) -> !torch.vtensor<[16,4],f32>
    %int-1 = torch.constant.int -1
    %false = torch.constant.bool false
    %3 = torch.aten.embedding %2, %0, %int-1, %false, %false : !torch.vtensor<[16,4],f32>, !torch.vtensor<[1,8],si64>, !torch.int, !torch.bool, !torch.bool -> !torch.vtensor<[1,8,4],f32>
    %int1 = torch.constant.int 1
    %4 = torch.aten.add.Tensor %3, %arg0, %int1 : !torch.vtensor<[1,8,4],f32>, !torch.vtensor<[1,8,4],f32>, !torch.int -> !torch.vtensor<[1,8,4],f32>
    return %4 : !torch.vtensor<[1,8,4],f32>
  }
}
{-#
  dialect_resources: {
    builtin: {
      positions: "POSITIONS"
    }
  }
#-}
""".replace("POSITIONS", "0x08000000" + "".join(i.to_bytes(8, "little").hex().upper() for i in range(8)))


def test_a_module_that_cannot_go_between_phases_as_bytecode_goes_as_text(caplog):
    import iree.runtime as rt

    from tori.targets import Target
    from tori.targets.build import compile_with_strategy

    with caplog.at_level("INFO", logger="tori.compile"):
        # Linked as IREE links them: grouped executables go from the configuration phase as text anyway.
        vmfb, used, _ = compile_with_strategy(SIGNED_RESOURCE.encode(),
                                              Options(iree_flags=("--iree-hal-link-executables=true",)), Target.CPU,
                                              None, graph="signed")
    assert used.text_between and "--emit-mlir-bytecode" not in used.shell_command("in.mlir")
    assert any("cannot serialize resource" in r.getMessage() for r in caplog.records)
    table, x = torch.randn(16, 4), torch.randn(1, 8, 4)
    index = rt.ParameterIndex()
    index.add_buffer("table", table.numpy().tobytes())
    config = rt.Config("local-sync")
    instance = config.vm_instance
    *_, module = rt.load_vm_modules(rt.create_io_parameters_module(instance, index.create_provider(scope="model")),
                                    rt.create_hal_module(instance, config.device),
                                    rt.VmModule.copy_buffer(instance, vmfb), config=config)
    torch.testing.assert_close(torch.from_numpy(module.main(x.numpy()).to_host()), table[:8].unsqueeze(0) + x)


def test_pipeline_option_runs_mlir_passes_at_the_tori_stage():
    assert_matches_eager(lambda x: (x + 0) * 1, torch.randn(4), options={"pipeline": "canonicalize"})
    record = tori.last_compile()
    assert "torch.constant.int" in record.stages["torch"]
    assert record.stages["tori"] != record.stages["torch"]


def test_unknown_pass_in_pipeline_is_an_options_error():
    with pytest.raises(OptionsError, match="unknown pass 'no-such-pass'"):
        torch.compile(lambda x: x + 1, backend="tori", options={"pipeline": "no-such-pass", "fallback": "error"})(torch.ones(2))


def test_parameters_updated_in_place_or_replaced_are_seen_by_the_next_call():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    # One pinned driver, so that every call goes through the same parameter cache.
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "driver": "local-sync"})
    x = torch.randn(3, 4)
    with torch.no_grad(), count_graphs() as count:
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model(x))
        model[0].weight.mul_(-2.0)  # in place: the tensor's version changes
        torch.testing.assert_close(compiled(x), model(x))
        model[2].bias.data = torch.randn(2)  # new storage behind the same parameter
        torch.testing.assert_close(compiled(x), model(x))
        model.load_state_dict({k: torch.randn_like(v) for k, v in model.state_dict().items()})
        torch.testing.assert_close(compiled(x), model(x))
    assert count.compiled_graphs == 1 and count.compiled_calls == 6 and count.fallback_calls == 0


def test_non_contiguous_parameter_updated_in_place_is_seen():
    class Transposed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # A non-contiguous parameter: tori passes IREE a dense copy of it.
            self.weight = torch.nn.Parameter(torch.randn(4, 3).t())

        def forward(self, x):
            return x @ self.weight

    model = Transposed()
    assert not model.weight.is_contiguous()
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "driver": "local-sync"})
    x = torch.randn(2, 3)
    with torch.no_grad(), count_graphs() as count:
        torch.testing.assert_close(compiled(x), model(x))
        model.weight.add_(1.0)
        torch.testing.assert_close(compiled(x), model(x))
    assert count.compiled_calls == 2 and count.fallback_calls == 0


@pytest.mark.parametrize("build", [
    pytest.param(lambda: torch.nn.LayerNorm(8), id="layer_norm"),
    pytest.param(lambda: torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                             torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()), id="conv_bn"),
])
def test_dynamic_shapes_survive_dynamos_restarts(build):
    # Dynamo restarts its analysis (e.g. to tensorify a float scalar in LayerNorm's
    # eps under dynamic shapes); tori lets the restart through instead of falling back.
    model = build()
    convolutional = isinstance(model, torch.nn.Sequential)
    settle_batch_norm(model, torch.randn(2, 4, 8, 8) if convolutional else torch.randn(2, 3, 8))
    compiled = torch.compile(model, backend="tori", dynamic=True, options={"fallback": "error"})
    shapes = [(2, 4, 8, 8), (3, 4, 8, 8), (5, 4, 8, 8)] if convolutional else [(2, 3, 8), (4, 5, 8)]
    with torch.no_grad(), count_graphs() as count:
        for shape in shapes:
            x = torch.randn(shape)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert count.compiled_graphs == 1 and count.fallback_graphs == 0 and count.compiled_calls == len(shapes)


def test_a_failing_call_is_a_tori_runtime_error_naming_the_graph():
    compiled = tori.compiler.compile(lambda x: x * 2, options={
        "fallback": "error", "guard_filter_fn": tori.compiler.skip_all_guards_unsafe})
    compiled(torch.ones(3))
    with pytest.raises(tori.errors.ToriRuntimeError, match=r"graph 'graph\d+_inference' failed .*dimension 0 mismatch"):
        compiled(torch.ones(4))


def test_threads_calling_one_graph_during_the_driver_trials():
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    compiled(torch.zeros(4))  # compile once, on this thread
    results, errors = [], []

    def worker(seed):
        try:
            for i in range(2 * TRIAL_CALLS_PER_DRIVER):
                x = torch.full((4,), float(seed * 100 + i))
                results.append(torch.equal(compiled(x), x * 2 + 1))
        except Exception as error:  # collected: a failure in a thread must fail the test
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(results) == 8 * TRIAL_CALLS_PER_DRIVER and all(results)
    assert tori.last_compile().forward.compiled.driver_choice is not None


@tori.passes.register_pass("test-breaks-ir")
def _break_ir(op, pass_):
    """Test pass: gives a torch.constant.int a string value, which its verifier rejects."""
    def visit(inner):
        if inner.name == "torch.constant.int":
            inner.attributes["value"] = ir.StringAttr.get("not an integer")
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)


def test_a_pass_that_breaks_the_ir_stops_there_with_its_input_as_repro(tmp_path):
    def f(x):
        return x * 3 + 1

    options = {"pipeline": "tori-fold-constants,test-breaks-ir", "repro_dir": str(tmp_path)}
    with pytest.raises(tori.passes.PassError) as raised:
        torch.compile(f, backend="tori", options={**options, "fallback": "error"})(torch.ones(2))
    error = raised.value
    assert error.stage == "tori" and error.op == "pass test-breaks-ir" and "IREE" not in error.reason
    assert error.repro.read_text() == error.ir_before and "torch.constant.float 3.0" in error.ir_before
    assert error.command.endswith(f"-m tori.passes.run {error.repro} --pipeline test-breaks-ir")
    # The command's runner, in a fresh interpreter that also has this test pass.
    replay = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_pipeline; "
              f"from tori.passes.run import main; sys.exit(main([{str(error.repro)!r}, '--pipeline', 'test-breaks-ir']))")
    done = subprocess.run([sys.executable, "-c", replay], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "pass 'test-breaks-ir' failed or produced invalid IR" in done.stderr
    # With the default fallback the graph runs eagerly, and nothing reached iree-compile.
    torch._dynamo.reset()
    with count_graphs() as count:
        torch.testing.assert_close(torch.compile(f, backend="tori", options=options)(torch.ones(2)), f(torch.ones(2)))
    assert count.fallback_graphs == 1 and "iree" not in tori.last_compile().forward.stages


def test_each_graph_records_the_passes_that_ran_on_it():
    def f(x):
        return x * (torch.ones(3) * 2)

    options = {"pipeline": "builtin.module(func.func(tori-fold-constants), cse)", "fallback": "error"}
    x = torch.randn(3)
    torch.testing.assert_close(torch.compile(f, backend="tori", options=options)(x), f(x))
    passes = tori.last_compile().forward.passes
    assert [(run.step.name, run.step.anchors) for run in passes] == [
        ("tori-fold-constants", ("builtin.module", "func.func")), ("cse", ("builtin.module",))]
    assert passes[0].changed and all(run.seconds > 0 for run in passes)
