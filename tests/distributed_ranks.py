"""tori under torch.distributed, in real ranks: each scenario runs in every rank
(torch.multiprocessing, gloo on loopback) and writes what it measured to
OUT/<scenario>.rank<R>.json for tests/test_distributed.py to check.

    python tests/distributed_ranks.py OUT SCENARIO [SCENARIO ...] [--world-size 2] [--timeout 300]

Scenarios: ddp (a model with its own forward, torch.compile), ddp_sequential (an
nn.Sequential, tori.compile), ddp_fallback (a piece that falls back), fsdp2
(fully_shard per block and the root, each block compiled), fsdp2_root (the root
compiled), checkpoint (activation checkpointing in the compiled graph),
guard_collectives (a guard that fails on rank 1 only), die (rank 1 exits
mid-collective). The ranks share TORI_CACHE_DIR, so every distinct graph should be
compiled once.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

STRICT = {"fallback": "error"}
STEPS = 3


class Mlp(torch.nn.Module):
    """Four 512-wide layers: 1 MiB of weights each, one DDP bucket each at bucket_cap_mb=1."""

    def __init__(self, width: int = 512, depth: int = 4):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class Block(torch.nn.Module):
    def __init__(self, width: int = 64):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 4 * width)
        self.fc2 = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Blocks(torch.nn.Module):
    def __init__(self, depth: int = 2, width: int = 64):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 8)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class CheckpointedBlocks(Blocks):
    """Blocks, each checkpointed when `checkpointed` (a forward of its own: Dynamo's
    cache is per code object, and the FSDP scenarios compile Blocks.forward)."""

    checkpointed = False

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(x)


def _max_diff(pairs) -> float:
    return max((float((a - b).abs().max()) for a, b in pairs), default=0.0)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def _train_both(eager: torch.nn.Module, compiled_call, compiled_module: torch.nn.Module, make_input) -> dict:
    """STEPS SGD steps of the eager and the compiled model on the same inputs; the
    largest difference of losses, gradients (each step) and parameters (at the end)."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (eager, compiled_module)]
    losses, grad_diff = [], 0.0
    for step in range(STEPS):
        x = make_input(step)
        step_losses = []
        for call, optimizer in zip((eager, compiled_call), optimizers):
            optimizer.zero_grad()
            loss = call(x).pow(2).mean()
            loss.backward()
            step_losses.append(loss.detach().item())
        grad_diff = max(grad_diff, _max_diff((_full(a.grad), _full(b.grad)) for a, b in
                                             zip(eager.parameters(), compiled_module.parameters())))
        for optimizer in optimizers:
            optimizer.step()
        losses.append(step_losses)
    return {"losses": losses, "max_grad_diff": grad_diff,
            "max_param_diff": _max_diff((_full(a), _full(b)) for a, b in
                                        zip(eager.parameters(), compiled_module.parameters()))}


def _input(rank: int, *shape):
    def make(step: int) -> torch.Tensor:
        return torch.randn(*shape, generator=torch.Generator().manual_seed(100 * step + rank))
    return make


def ddp(rank: int) -> dict:
    """A model with its own forward under DDP, torch.compile(backend='tori')."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = Mlp()
    eager, mine = DDP(copy.deepcopy(base), bucket_cap_mb=1), DDP(copy.deepcopy(base), bucket_cap_mb=1)
    compiled = torch.compile(mine, backend="tori", options=STRICT)
    return _train_both(eager, compiled, mine, _input(rank, 8, 512))


def ddp_sequential(rank: int) -> dict:
    """An nn.Sequential under DDP: torch.compile captures nothing of it (any backend);
    tori.compile compiles the wrapped module in place."""
    import tori
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(3)])
    eager, mine = DDP(copy.deepcopy(base), bucket_cap_mb=1), DDP(copy.deepcopy(base), bucket_cap_mb=1)
    compiled = tori.compile(mine, options=STRICT)
    result = _train_both(eager, compiled, mine, _input(rank, 8, 512))
    result["returned_the_ddp_module"] = compiled is mine
    return result


class EigenvalueTail(Mlp):
    """Mlp whose output passes through general eigenvalues (of 2x2 blocks), which tori
    refuses: the DDP piece holding it falls back, the others compile."""

    def forward(self, x):
        x = super().forward(x)
        return torch.view_as_real(torch.linalg.eigvals(x.reshape(*x.shape[:-1], -1, 2, 2))).flatten(-3)


def ddp_fallback(rank: int, out: Path) -> dict:
    """A DDP piece that falls back (fallback='eager', partition off): a warning that
    names the rank and the piece; the report written per rank."""
    import logging

    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    base = EigenvalueTail()
    eager, mine = DDP(copy.deepcopy(base), bucket_cap_mb=1), DDP(copy.deepcopy(base), bucket_cap_mb=1)
    compiled = torch.compile(mine, backend="tori", options={"fallback": "eager", "partition": False,
                                                            "report": str(out / "report.html")})
    warnings: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("tori").addHandler(handler)
    from tori.stats import counters

    before = counters.snapshot()
    try:
        result = _train_both(eager, compiled, mine, _input(rank, 8, 512))
    finally:
        logging.getLogger("tori").removeHandler(handler)
    result["fallback_run"] = vars(counters.since(before))
    result["warnings"] = [w for w in warnings if "eager PyTorch" in w]
    # With fallback="error" the same piece raises, on every rank alike.
    strict = torch.compile(DDP(copy.deepcopy(base), bucket_cap_mb=1), backend="tori", options=STRICT)
    try:
        strict(_input(rank, 8, 512)(0))
        result["strict_error"] = None
    except Exception as error:  # noqa: BLE001 - reported to the test
        result["strict_error"] = f"{type(error).__name__}: {error}"
    return result


def fsdp2(rank: int, whole: bool = False) -> dict:
    """fully_shard per block and the root; each block compiled by tori (or, `whole`,
    the root model)."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    eager = Blocks()
    mine = copy.deepcopy(eager)
    for model in (eager, mine):
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    if whole:
        call = torch.compile(mine, backend="tori", options=STRICT)
    else:
        for block in mine.blocks:
            block.compile(backend="tori", options=STRICT)
        call = mine
    result = _train_both(eager, call, mine, _input(rank, 4, 16, 64))
    result["sharded"] = all(hasattr(p, "full_tensor") for p in mine.parameters())
    return result


def fsdp2_root(rank: int) -> dict:
    """fully_shard per block and the root; the root compiled by tori."""
    return fsdp2(rank, whole=True)


def checkpoint(rank: int) -> dict:
    """Activation checkpointing inside the compiled graph: recomputation in tori's
    backward graph, gradients as eager's, fewer bytes saved for the backward."""
    from tori.frontend.records import compile_records
    from tori.stages import Stage

    torch.manual_seed(0)
    plain = CheckpointedBlocks(depth=4, width=128)
    result = {}
    for checkpointed in (False, True):
        eager = copy.deepcopy(plain)
        eager.checkpointed = checkpointed
        mine = copy.deepcopy(eager)
        compiled = torch.compile(mine, backend="tori", options=STRICT)
        seen = len(compile_records())
        saved: list[int] = []

        def pack(tensor):
            saved.append(tensor.numel() * tensor.element_size())
            return tensor

        x = torch.randn(32, 64, 128, generator=torch.Generator().manual_seed(rank))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = compiled(x)
        out.pow(2).mean().backward()
        expected = eager(x)
        expected.pow(2).mean().backward()
        backward = [g for r in compile_records()[seen:] for g in r.graphs if g.kind == "backward"]
        result["checkpointed" if checkpointed else "plain"] = {
            "saved_bytes": sum(saved),
            "max_grad_diff": _max_diff((a.grad, b.grad) for a, b in zip(eager.parameters(), mine.parameters())),
            "max_out_diff": float((out - expected).abs().max()),
            "backward_graphs": len(backward),
            # Recomputation shows in the backward graph: the forward's matmuls again, and the
            # LayerNorm statistics (rsqrt), which a backward of saved activations never computes.
            "backward_mm": sum(g.stages[Stage.ATEN].count("aten.mm.") for g in backward),
            "backward_rsqrt": sum(g.stages[Stage.ATEN].count("aten.rsqrt.") for g in backward),
        }
    return result


def _guarded_on(x):
    return torch.sin(x) * 2 + 1


def _guarded_off(x):  # its own code object: Dynamo's cache is per code object
    return torch.sin(x) * 2 + 1


def guard_collectives(rank: int) -> dict:
    """A guard that fails on rank 1 only: with guard collectives on, both ranks
    recompile; without, only rank 1 does."""
    import tori
    from tori.stats import counters

    result = {}
    for enabled, fn in ((True, _guarded_on), (False, _guarded_off)):
        compiled = tori.compile(fn, options=STRICT, dynamic=False)
        previous = tori.compiler.set_enable_guard_collectives(enabled)
        try:
            compiled(torch.randn(4))
            before = counters.compiled_graphs
            compiled(torch.randn(4))  # every guard passes everywhere
            steady = counters.compiled_graphs - before
            x = torch.randn(8 if rank == 1 else 4)
            out = compiled(x)  # rank 1's shape guard fails
            after = counters.compiled_graphs - before - steady
        finally:
            tori.compiler.set_enable_guard_collectives(previous)
        result["on" if enabled else "off"] = {"steady_compiles": steady, "compiles_after_one_rank_failed": after,
                                               "matches_eager": bool(torch.allclose(out, fn(x)))}
    return result


def die(rank: int) -> dict:
    """Rank 1 exits while rank 0 waits for it in a collective."""
    if rank == 1:
        os._exit(7)
    dist.barrier()
    return {}


SCENARIOS = {f.__name__: f for f in (ddp, ddp_sequential, ddp_fallback, fsdp2, fsdp2_root, checkpoint, guard_collectives, die)}
TAKES_OUT = {"ddp_fallback"}


def _rank_main(rank: int, world_size: int, port: int, out: str, scenarios: list[str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)  # two ranks on two cores
    from tori.frontend.records import compile_records
    from tori.stats import counters

    try:
        for name in scenarios:
            before = counters.snapshot()
            seen = len(compile_records())
            result = SCENARIOS[name](rank, Path(out)) if name in TAKES_OUT else SCENARIOS[name](rank)
            records = compile_records()[seen:]
            result["counters"] = vars(counters.since(before))
            result["graphs"] = [{"name": r.name, "rank": r.rank, "ddp_bucket": r.ddp_bucket,
                                 "kinds": [g.kind for g in r.graphs], "fell_back": r.fell_back,
                                 "modules": [g.modules_key for g in r.graphs]} for r in records]
            (Path(out) / f"{name}.rank{rank}.json").write_text(json.dumps(result, indent=1))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("scenarios", nargs="+", choices=sorted(SCENARIOS))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    arguments = parser.parse_args(argv)
    from tori.testing import RanksFailed, run_ranks

    Path(arguments.out).mkdir(parents=True, exist_ok=True)
    try:
        run_ranks(_rank_main, arguments.world_size, args=(arguments.out, arguments.scenarios),
                  timeout_s=arguments.timeout)
    except RanksFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
