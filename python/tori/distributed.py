"""tori under torch.distributed: the rank a process runs as, the per-rank paths of
what each rank writes (reports, dumps), and DDP models compiled where Dynamo can
capture them (docs/distributed.md).

`torch.compile(DistributedDataParallel(model))` relies on DDP's forward breaking the
graph (its C++ reducer cannot be traced) and on Dynamo then capturing the wrapped
module's own forward frame, split by DDPOptimizer at gradient-bucket boundaries. A
wrapped module whose forward is torch's own code (`nn.Sequential`, `nn.TransformerEncoder`)
has no frame Dynamo captures: torch/nn is in its skip list for top-level frames, so
nothing is compiled, by any backend. `tori.compile` compiles the wrapped module in place
instead, through a frame of tori's that Dynamo captures and that inlines the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch._guards


def rank() -> int | None:
    """This process's rank in torch.distributed's default group; None outside one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return None


def world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def ddp_bucket() -> int | None:
    """While DDPOptimizer compiles the pieces of a DDP model's graph, the index of the
    piece (gradient bucket) being compiled, counted from the first one that runs."""
    context = torch._guards.TracingContext.try_get()
    ddp = getattr(context, "ddp_optimizer_ctx", None) if context is not None else None
    return ddp.curr_bucket + 1 if ddp is not None else None


def describe() -> str:
    """Where a graph being compiled sits, for messages: " (rank 1, DDP bucket 2)";
    empty outside torch.distributed."""
    parts = [f"rank {found}" for found in [rank()] if found is not None]
    parts += [f"DDP bucket {bucket}" for bucket in [ddp_bucket()] if bucket is not None]
    return f" ({', '.join(parts)})" if parts else ""


def per_rank(path: Path | str, *, directory: bool = False) -> Path:
    """`path` for this rank when more than one rank runs, so that ranks never write
    over each other: the file `report.html` becomes `report.rank1.html`, the directory
    `dump` becomes `dump/rank1`."""
    path = Path(path)
    found = rank()
    if found is None or world_size() == 1:
        return path
    if directory:
        return path / f"rank{found}"
    return path.with_name(f"{path.stem}.rank{found}{path.suffix}")


def compile_data_parallel(model: Any, **torch_compile_kwargs: Any) -> Any | None:
    """A DistributedDataParallel `model` with its wrapped module compiled in place, and
    the DDP module returned (its parameters, state_dict keys and hooks unchanged); None
    for any other model."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel):
        return None
    compile_in_place(model.module, **torch_compile_kwargs)
    return model


def compile_in_place(module: torch.nn.Module, **torch_compile_kwargs: Any) -> torch.nn.Module:
    """`module.compile(...)`, also for torch.nn's own modules: Module.compile compiles
    the module's `_call_impl`, a frame in torch/nn that Dynamo skips, so a Sequential
    compiled that way runs eagerly. Here the compiled frame is tori's; Dynamo inlines
    the module's call (its hooks included) into it."""
    call: Callable = module._call_impl

    def forward(*args, **kwargs):
        return call(*args, **kwargs)

    module._compiled_call_impl = torch.compile(forward, **torch_compile_kwargs)
    return module
