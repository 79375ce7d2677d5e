"""Helpers for tests that compare tori with eager PyTorch and prove that the
graphs really ran compiled (a fallback never passes for success).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from tori.errors import ToriRuntimeError
from tori.stats import Counters, counters


@dataclass
class GraphCount:
    """Counters accumulated inside a `count_graphs()` block (filled when it exits)."""

    delta: Counters | None = None

    def __getattr__(self, name: str) -> Any:
        if name == "delta" or self.delta is None:
            raise AttributeError(name)
        return getattr(self.delta, name)


@contextlib.contextmanager
def count_graphs() -> Iterator[GraphCount]:
    result = GraphCount()
    before = counters.snapshot()
    try:
        yield result
    finally:
        result.delta = counters.since(before)


def cache_entries(cache_dir: Path, graphs: bool = False) -> list[Path]:
    """The compile cache's entries of modules in `cache_dir`, or with `graphs` those of
    the Dynamo graph cache (frontend/graph_cache.py), which name modules."""
    from tori.cache import CorruptEntry, read_entry
    from tori.frontend.graph_cache import ENTRY_KIND

    def kind(path: Path) -> str | None:
        try:
            return read_entry(path.stem, path.read_bytes())[1].get("kind")
        except (CorruptEntry, OSError):
            return None

    return [p for p in sorted(Path(cache_dir).glob("??/*.entry")) if (kind(p) == ENTRY_KIND) == graphs]


def _clone(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone().requires_grad_(value.requires_grad)
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, torch.nn.Module):
        return copy.deepcopy(value)
    return value


def assert_matches_eager(
    fn: Callable,
    *args: Any,
    options: dict | None = None,
    dynamic: bool | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    calls: int = 1,
    check_dtype: bool = True,
    fullgraph: bool = True,
) -> Any:
    """Compile `fn` with tori (fallback='error'), check every call against eager,
    and assert that at least one graph compiled and every call ran compiled.

    `fullgraph=True` (the default) makes a graph break an error: without it, an op
    Dynamo cannot capture runs in eager Python between compiled graphs and the
    check still passes. A test that expects a break passes `fullgraph=False`."""
    torch._dynamo.reset()
    expected = fn(*_clone(args))
    compiled = torch.compile(fn, backend="tori", options={"fallback": "error", **(options or {})}, dynamic=dynamic,
                             fullgraph=fullgraph)
    with count_graphs() as count:
        for _ in range(calls):
            actual = compiled(*_clone(args))
            torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, check_dtype=check_dtype, equal_nan=True)
    assert count.compiled_graphs >= 1, f"no graph was compiled by tori: {count.delta}"
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, f"a graph fell back to eager: {count.delta}"
    assert count.compiled_calls >= calls, f"fewer compiled calls than calls: {count.delta}"
    return actual


def assert_same_training_state(model: torch.nn.Module, eager: torch.nn.Module, *, rtol: float | None = None,
                               atol: float | None = None) -> None:
    """Assert that `model` (trained compiled) and `eager` (trained the same way in eager
    PyTorch) hold the same gradients, parameters and buffers."""
    for (name, param), expected in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(param.grad, expected.grad, rtol=rtol, atol=atol, msg=lambda m: f"grad of {name}: {m}")
        torch.testing.assert_close(param, expected, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")
    for (name, buffer), expected in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(buffer, expected, rtol=rtol, atol=atol, msg=lambda m: f"buffer {name}: {m}")


def settle_batch_norm(model: torch.nn.Module, *inputs: Any, passes: int = 3) -> torch.nn.Module:
    """`model` in eval mode with BatchNorm statistics and affine terms of its own.

    A fresh BatchNorm's running mean 0 and variance 1, and its weight 1 and bias 0,
    make it in eval mode nearly the identity: a lowering or folding bug in it would go
    unseen. The running statistics here come from `passes` training-mode forward
    passes over `inputs` (float inputs scaled and shifted per pass), averaged over the
    passes; the affine terms are drawn from a fixed generator. A model without
    BatchNorm is only put in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return model.eval()
    generator = torch.Generator().manual_seed(0)
    momenta = [norm.momentum for norm in norms]
    with torch.no_grad():
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None  # a cumulative average over the passes
            if norm.affine:
                norm.weight.uniform_(0.5, 1.5, generator=generator)
                norm.bias.normal_(0.0, 0.2, generator=generator)
        model.train()
        for k in range(passes):
            model(*(x * (1 + 0.5 * k) + 0.25 * k if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                    for x in inputs))
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    return model.eval()


_TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_torchvision_library = None


def quantize_pt2e(model: torch.nn.Module, *inputs: Any, dynamic: bool = False, per_channel: bool = True,
                  calibration: int = 4) -> torch.fx.GraphModule:
    """`model` quantized to int8 with PyTorch 2 export quantization (torchao's
    `prepare_pt2e` / `convert_pt2e` and `X86InductorQuantizer`): weights int8 (per
    channel or per tensor), activations uint8 per tensor, static (calibrated on
    `inputs` and `calibration` random batches of their shapes) or dynamic."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    config = get_default_x86_inductor_quantization_config(is_dynamic=dynamic)
    if not per_channel:
        from torchao.quantization.pt2e.observer import MinMaxObserver
        from torchao.quantization.pt2e.quantizer import QuantizationSpec

        config = dataclasses.replace(config, weight=QuantizationSpec(
            dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_symmetric, is_dynamic=False,
            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12)))
    exported = torch.export.export(model.eval(), tuple(inputs)).module()
    quantizer = X86InductorQuantizer()
    quantizer.set_global(config)
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        prepared(*inputs)
        for _ in range(calibration):
            prepared(*(torch.randn_like(x) if x.is_floating_point() else x for x in inputs))
    return convert_pt2e(prepared)


def allow_torchvision_import() -> None:
    """Let torchvision's Python side import on a CPU build of torch.

    PyPI's torchvision 0.28.0 (the release for torch 2.13) is a CUDA build: its
    extension does not load against CPU torch, and its import then fails registering
    fake kernels for `torchvision::nms` and `qnms`, whose schemas the extension would
    have defined. timm imports torchvision, and so does transformers wherever it is
    installed. Defining the two schemas first lets the import succeed; no timm or
    transformers model that tori runs calls either op.
    """
    global _torchvision_library
    if _torchvision_library is not None:
        return
    try:
        torch._C._dispatch_find_schema_or_throw("torchvision::nms", "")
    except RuntimeError:  # no extension defined it
        _torchvision_library = torch.library.Library("torchvision", "DEF")
        for schema in _TORCHVISION_SCHEMAS:
            _torchvision_library.define(schema)


def import_timm():
    """timm, imported on a CPU build of torch (allow_torchvision_import)."""
    allow_torchvision_import()
    import timm

    return timm


class RanksFailed(ToriRuntimeError):
    """A rank of `run_ranks` raised, died or ran past its time limit."""


def free_port() -> int:
    """A TCP port free on loopback now, for a process group's rendezvous."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(fn: Callable[..., None], world_size: int = 2, *, args: tuple = (), timeout_s: float = 300.0) -> None:
    """Run `fn(rank, world_size, port, *args)` in `world_size` fresh processes
    (torch.multiprocessing, spawn), `port` a free loopback port for their rendezvous
    (`init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", ...)`).

    Returns when every rank returned. Raises RanksFailed, after stopping the other
    ranks, as soon as one raises or dies, and when they run past `timeout_s`: a rank
    that dies mid-collective never leaves the others waiting.
    """
    import time

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    context = mp.start_processes(fn, args=(world_size, free_port(), *args), nprocs=world_size, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise RanksFailed(f"{world_size} ranks ran past {timeout_s:.0f} s; stopped")
    except ProcessException as error:
        raise RanksFailed(f"rank {error.error_index} failed: {error}") from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(5)
