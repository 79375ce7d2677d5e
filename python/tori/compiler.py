"""`tori.compiler`: every public name of `torch.compiler`, with the same signature and
meaning, made tori-aware where that adds something (docs/compiler-api.md).

`compile` defaults to the tori backend, `reset` also clears tori's caches, `config` is
tori's own options (with torch's under `config.torch`), `set_stance` checks the stance
name up front. The rest forwards to torch, whose mechanisms (Dynamo's stances, guards,
polyfills) already apply to whatever backend compiles the graph.
"""

from __future__ import annotations

import gc
from typing import Any, Callable

import torch
import torch.compiler as _torch_compiler
from torch.compiler import (  # noqa: F401  (re-exported unchanged: see the module docstring)
    allow_in_graph,
    assume_constant_result,
    cudagraph_mark_step_begin,
    disable,
    get_default_backend,
    is_compiling,
    is_dynamo_compiling,
    keep_portable_guards_unsafe,
    keep_tensor_guards_unsafe,
    load_cache_artifacts,
    load_compiled_function,
    nested_compile_region,
    save_cache_artifacts,
    set_default_backend,
    set_enable_guard_collectives,
    skip_all_guards_unsafe,
    skip_guard_on_all_nn_modules_unsafe,
    skip_guard_on_globals_unsafe,
    skip_guard_on_inbuilt_nn_modules_unsafe,
    substitute_in_graph,
    wrap_numpy,
)

from tori.config import Options, config
from tori.errors import OptionsError
from tori.targets import Target

BACKEND = "tori"

# Keys of torch.compile's `options` that torch itself takes out, for every backend.
TORCH_OPTIONS = ("guard_filter_fn",)

# Dynamo's stances (torch.compiler.set_stance's documentation), checked before Dynamo,
# which would only complain at the next compiled call.
STANCES = ("default", "force_eager", "eager_on_recompile", "fail_on_recompile",
           "eager_then_compile", "aot_eager_then_compile")


def compile(model: Callable | None = None, *, target: Target | str | None = None,
            options: dict[str, Any] | None = None, **torch_compile_kwargs: Any):
    """`torch.compile` with `backend="tori"` as the default; a decorator too.

    `target` picks the IREE target (as `options={"target": ...}`); options are checked
    here, before the first call, so a typo fails where it is written. `guard_filter_fn`
    in options goes to Dynamo, as with torch.compile.
    """
    if model is not None and not callable(model):
        raise OptionsError("model", model, [], message=f"tori.compile takes a callable (a function or an "
                                                         f"nn.Module), not {type(model).__name__} {model!r}")
    backend = torch_compile_kwargs.pop("backend", BACKEND)
    if backend == BACKEND:
        if options is not None and not isinstance(options, dict):
            Options.from_mapping(options)  # raises: options must be a dict
        merged = dict(options or {})
        if target is not None:
            merged["target"] = target
        Options.from_mapping({k: v for k, v in merged.items() if k not in TORCH_OPTIONS})
        options = merged or None
    elif target is not None:
        raise OptionsError("backend for target=", backend, [BACKEND], hint="target= applies to the tori backend only",
                           unknown=True)
    if model is None:
        return lambda fn: torch.compile(fn, backend=backend, options=options, **torch_compile_kwargs)
    from tori.distributed import compile_data_parallel

    if (compiled := compile_data_parallel(model, backend=backend, options=options, **torch_compile_kwargs)) is not None:
        return compiled
    return torch.compile(model, backend=backend, options=options, **torch_compile_kwargs)


def reset() -> None:
    """Clear Dynamo's state and every tori cache in memory; the next call recompiles."""
    from tori.frontend import compile_heap
    from tori.frontend.records import clear_records
    from tori.runtime.devices import release_all

    _torch_compiler.reset()
    compile_heap.install()  # torch's reset dropped Dynamo's compile callbacks
    clear_records()
    gc.collect()  # compiled modules hold IREE contexts: free them before their devices
    release_all()


def inspect(fn: Callable, *example_inputs: Any, stages=None, target: Target | str | None = None,
            options: dict[str, Any] | None = None, keep_large_constants: bool = False):
    """The text of each stage (dynamo, aten, torch, tori, iree) of `fn` on `example_inputs`,
    as strings, without building an IREE module (docs/inspect.md)."""
    from tori.tools.inspect_stages import inspect as inspect_stages

    return inspect_stages(fn, *example_inputs, stages=stages, target=target, options=options,
                          keep_large_constants=keep_large_constants)


# tori.export calls under way (tori/aot/export.py sets it around tracing and the eager reference run).
_exports_in_progress = 0


def is_exporting() -> bool:
    """True while torch.export traces, and throughout `tori.export` (its eager reference
    run included, so that a model branching on it runs the same code in both)."""
    return _exports_in_progress > 0 or _torch_compiler.is_exporting()


def list_backends(exclude_tags=("debug", "experimental")) -> list[str]:
    """Dynamo's backends; `tori` is among them through its entry point."""
    return _torch_compiler.list_backends(exclude_tags)


def set_stance(stance: str = "default", *, skip_guard_eval_unsafe: bool = False,
               force_backend: str | Callable[..., Any] | None = None):
    """Dynamo's stance (a decorator or a `with` block), for tori's graphs like any backend's."""
    if stance not in STANCES:
        raise OptionsError("stance", stance, STANCES, unknown=True)
    return _torch_compiler.set_stance(stance, skip_guard_eval_unsafe=skip_guard_eval_unsafe, force_backend=force_backend)


__all__ = list(_torch_compiler.__all__)
