"""Training under DDP: step time of a 6-block transformer on 2 gloo ranks (one CPU
thread each), eager DDP, inductor and tori timed in the same ranks of one run.

    python benchmarks/distributed.py [--steps N] [--json PATH]

A step is forward, backward (with DDP's gradient all-reduce) and an SGD update; the
median over `--steps` timed steps after warm-up, the ranks synchronized by a barrier
before each. tori runs with fallback="error" and every rank must have compiled graphs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from tori.runtime.compiled_graph import TRIAL_CALLS_PER_DRIVER

BLOCKS, WIDTH, HEADS, TOKENS, BATCH = 6, 256, 4, 64, 8
CONFIGS = ("eager", "inductor", "tori")
WARMUP = 2 * TRIAL_CALLS_PER_DRIVER + 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(WIDTH), torch.nn.LayerNorm(WIDTH)
        self.qkv, self.out = torch.nn.Linear(WIDTH, 3 * WIDTH), torch.nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, tokens, WIDTH))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _step_times(call, model, x, steps: int, warmup: int) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for step in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        call(x).pow(2).mean().backward()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _rank_main(rank: int, world_size: int, port: int, steps: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=600))
    torch.set_num_threads(1)
    import tori
    from torch.nn.parallel import DistributedDataParallel as DDP

    x = torch.randn(BATCH, TOKENS, WIDTH, generator=torch.Generator().manual_seed(rank))
    results = {}
    for config in CONFIGS:
        torch.manual_seed(0)
        model = DDP(Transformer())
        before = tori.counters.snapshot()
        if config == "eager":
            call = model
        elif config == "inductor":
            call = torch.compile(model, backend="inductor")
        else:
            call = torch.compile(model, backend="tori", options={"fallback": "error"})
        first_step = _step_times(call, model, x, 1, 0)[0]  # the compile included
        # Past tori's driver trial (driver="auto" tries local-sync and local-task on each
        # graph's first calls), the same warm-up for every configuration.
        times = _step_times(call, model, x, steps, warmup=WARMUP)
        counted = tori.counters.since(before)
        results[config] = {"median_ms": 1e3 * statistics.median(times), "first_step_s": first_step,
                           "compiled_graphs": counted.compiled_graphs, "fallback_graphs": counted.fallback_graphs}
    if results["tori"]["compiled_graphs"] == 0 or results["tori"]["fallback_graphs"]:
        raise RuntimeError(f"rank {rank}: tori compiled nothing or fell back: {results['tori']}")
    gathered = [None] * world_size
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args(argv)
    from tori.testing import run_ranks

    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "ranks.json"
        run_ranks(_rank_main, 2, args=(arguments.steps, str(out)), timeout_s=1800)
        per_rank = json.loads(out.read_text())
    summary = {config: {"median_ms": max(r[config]["median_ms"] for r in per_rank),
                        "first_step_s": max(r[config]["first_step_s"] for r in per_rank),
                        "compiled_graphs_per_rank": [r[config]["compiled_graphs"] for r in per_rank]}
               for config in CONFIGS}
    eager = summary["eager"]["median_ms"]
    print(f"DDP training step, {BLOCKS}-block transformer (width {WIDTH}, {TOKENS} tokens, batch {BATCH}), "
          f"2 gloo ranks, 1 thread each; slowest rank's median over {arguments.steps} steps")
    for config in CONFIGS:
        row = summary[config]
        print(f"  {config:9s} {row['median_ms']:8.1f} ms/step  eager/this {eager / row['median_ms']:5.2f}x  "
              f"first step {row['first_step_s']:6.1f} s  tori graphs per rank {row['compiled_graphs_per_rank']}")
    print(f"  tori vs inductor: {summary['inductor']['median_ms'] / summary['tori']['median_ms']:.2f}x")
    if arguments.json is not None:
        arguments.json.parent.mkdir(parents=True, exist_ok=True)
        arguments.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "per_rank": per_rank,
                                              "summary": summary}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
