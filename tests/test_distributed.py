"""tori under torch.distributed, in 2 real ranks (torch.multiprocessing, gloo on
loopback): DDP pieces and FSDP2 blocks compiled, gradients as eager's, activation
checkpointing recomputed in tori's backward graph, guard collectives, one compile per
graph across ranks, and a rank that dies failing the run instead of hanging it.

The scenarios run in tests/distributed_ranks.py, all in one launch of the ranks; each
rank writes what it measured as JSON, checked here.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
RANKS = ROOT / "tests" / "distributed_ranks.py"
WORLD = 2
SCENARIOS = ("ddp", "ddp_sequential", "ddp_fallback", "fsdp2", "fsdp2_root", "checkpoint", "guard_collectives")
# Scenarios whose graphs are compiled only for running: ddp_fallback writes a report,
# whose dispatch counts run iree-compile for inspection.
COMPILE_ONCE = tuple(s for s in SCENARIOS if s != "ddp_fallback")
TOLERANCE = 1e-5

pytestmark = [pytest.mark.xdist_group("distributed"),  # one worker: the `ranks` fixture launches every scenario
              pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                 reason="this torch has no gloo backend")]


def launch(out: Path, *scenarios: str, cache_dir: Path, timeout: float = 400.0) -> subprocess.CompletedProcess:
    environ = {**os.environ, "TORI_CACHE_DIR": str(cache_dir)}
    return subprocess.run([sys.executable, str(RANKS), str(out), *scenarios, "--world-size", str(WORLD),
                           "--timeout", str(timeout)], env=environ, capture_output=True, text=True,
                          timeout=timeout + 60)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    """scenario -> what each rank measured, rank 0 first; "out": the directory they wrote."""
    out = tmp_path_factory.mktemp("ranks")
    done = launch(out, *SCENARIOS, cache_dir=tmp_path_factory.mktemp("cache"))
    assert done.returncode == 0, done.stderr[-4000:]
    return {name: [json.loads((out / f"{name}.rank{rank}.json").read_text()) for rank in range(WORLD)]
            for name in SCENARIOS} | {"out": out}


def compiled_everywhere(results: list[dict], *, graphs: int | None, calls: int) -> None:
    for rank, result in enumerate(results):
        counted = result["counters"]
        assert graphs is None or counted["compiled_graphs"] == graphs, (rank, counted)
        assert counted["compiled_calls"] == calls, (rank, counted)
        assert counted["fallback_graphs"] == counted["fallback_calls"] == counted["partitioned_graphs"] == 0
        assert all(not g["fell_back"] and g["rank"] == rank for g in result["graphs"])
        assert result["max_grad_diff"] <= TOLERANCE and result["max_param_diff"] <= TOLERANCE, result
        # Gradients equal on both ranks is DDP's own promise; the losses differ (each rank its own data).
        for eager, compiled in result["losses"]:
            assert abs(eager - compiled) <= TOLERANCE * max(1.0, abs(eager))


def ddp_pieces(result: dict) -> list[tuple[int, list[str]]]:
    return sorted((g["ddp_bucket"], g["kinds"]) for g in result["graphs"])


def test_ddp_compiles_every_piece_forward_and_backward_on_every_rank(ranks):
    results = ranks["ddp"]
    # Four 1 MiB layers at bucket_cap_mb=1: DDPOptimizer splits the graph into four pieces.
    compiled_everywhere(results, graphs=8, calls=8 * 3)
    for result in results:
        assert ddp_pieces(result) == [(bucket, ["forward", "backward"]) for bucket in range(4)]


def test_ddp_of_an_nn_sequential_compiles_through_tori_compile(ranks):
    results = ranks["ddp_sequential"]
    compiled_everywhere(results, graphs=6, calls=6 * 3)
    for result in results:
        assert result["returned_the_ddp_module"]
        assert ddp_pieces(result) == [(bucket, ["forward", "backward"]) for bucket in range(3)]


def test_a_ddp_piece_that_falls_back_says_so_and_the_others_compile_or_it_raises(ranks):
    for rank, result in enumerate(ranks["ddp_fallback"]):
        counted = result["fallback_run"]
        assert counted["compiled_graphs"] == 6 and counted["fallback_graphs"] == 2, counted
        # Piece 3 failed to compile twice: in the run with fallback="eager", then with "error".
        assert [g["ddp_bucket"] for g in result["graphs"] if g["fell_back"]] == [3, 3]
        assert result["max_grad_diff"] <= TOLERANCE
        assert len(result["warnings"]) == 2
        assert all(f"(rank {rank}, DDP bucket 3) runs in eager PyTorch" in w for w in result["warnings"])
        # The forward is refused at linalg_eig, its backward at the complex solve of eig's gradient.
        assert "op aten linalg_eig.default" in result["warnings"][0], result["warnings"]
        assert "on complex values has no rule in tori" in result["warnings"][1], result["warnings"]
        # fallback="error" is honoured: the piece's compile error reaches the caller.
        assert result["strict_error"] is not None and "aten linalg_eig.default" in result["strict_error"]
        # Each rank writes its own report, its graphs named with rank and bucket.
        report = (ranks["out"] / f"report.rank{rank}.html").read_text()
        assert f"(rank {rank})</small> <small>(DDP bucket 3)" in report
        assert f"(rank {1 - rank})" not in report
    assert not (ranks["out"] / "report.html").exists()


def test_fsdp2_blocks_compile_and_train_as_eager_fsdp2(ranks):
    results = ranks["fsdp2"]
    # Two blocks, each a forward and a backward graph.
    compiled_everywhere(results, graphs=4, calls=4 * 3)
    assert all(result["sharded"] for result in results)


def test_fsdp2_root_compiled_whole_trains_as_eager_fsdp2(ranks):
    results = ranks["fsdp2_root"]
    # FSDP's hooks break the root's graph at each block; the blocks' frames are those
    # of the test before (Dynamo's cache is per code object, its guards pass): their
    # graphs serve every call, compiled.
    compiled_everywhere(results, graphs=None, calls=4 * 3)
    assert all(result["sharded"] for result in results)


def test_activation_checkpointing_recomputes_in_tori_backward_and_saves_less(ranks):
    for result in ranks["checkpoint"]:
        plain, checkpointed = result["plain"], result["checkpointed"]
        for run in (plain, checkpointed):
            assert run["max_grad_diff"] <= TOLERANCE and run["max_out_diff"] <= 1e-4 and run["backward_graphs"] == 1
        assert plain["backward_rsqrt"] == 0 and checkpointed["backward_rsqrt"] > 0
        assert checkpointed["backward_mm"] > plain["backward_mm"]
        assert checkpointed["saved_bytes"] < 0.25 * plain["saved_bytes"], (checkpointed, plain)
        assert result["counters"]["fallback_graphs"] == 0


def test_guard_collectives_make_every_rank_recompile_together(ranks):
    on = [result["on"] for result in ranks["guard_collectives"]]
    off = [result["off"] for result in ranks["guard_collectives"]]
    assert all(r["steady_compiles"] == 0 and r["matches_eager"] for r in on + off)
    # Rank 1's guard failed: with collectives both ranks recompile, without only rank 1.
    assert [r["compiles_after_one_rank_failed"] for r in on] == [1, 1]
    assert [r["compiles_after_one_rank_failed"] for r in off] == [0, 1]


def test_each_distinct_graph_is_compiled_once_across_the_ranks(ranks):
    compiles = sum(ranks[s][rank]["counters"]["iree_compiles"] for s in COMPILE_ONCE for rank in range(WORLD))
    distinct = {key for s in COMPILE_ONCE for result in ranks[s] for g in result["graphs"] for key in g["modules"]
                if key is not None}
    assert compiles == len(distinct) > 10
    # The ranks compiled at the same time: the second waited for the first's entry.
    assert sum(ranks[s][rank]["counters"]["cache_waits"] for s in COMPILE_ONCE for rank in range(WORLD)) > 0


def test_a_rank_that_dies_fails_the_run_without_hanging(tmp_path):
    start = time.monotonic()
    done = launch(tmp_path / "out", "die", cache_dir=tmp_path / "cache", timeout=120)
    assert done.returncode == 1
    assert "rank 1 failed" in done.stderr and "exit code 7" in done.stderr
    assert time.monotonic() - start < 60
