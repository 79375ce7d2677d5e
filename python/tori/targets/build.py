"""The `iree` stage for several targets at once: one torch-dialect module, one
iree-compile per target, run side by side (each is its own child process).
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import re

from tori.config import Options
from tori.errors import CompileError, OptionsError, UnsupportedOpError
from tori.targets import SPECS, Target, spec
from tori.targets.codegen import Strategy
from tori.targets.iree_compile import (GROUPING_FAILED, IreeInvocation, compile_flags, compiled_in_backends,
                                      run_iree_compile, unserializable)


def compiled_targets(options: Options) -> tuple[Target, ...]:
    """Every target a graph is compiled for: `target` first, then `targets`."""
    return tuple(dict.fromkeys((options.target, *options.targets)))


def cpu_only(targets: tuple[Target, ...]) -> bool:
    """Whether every target a module is compiled for is a CPU (tori's passes may then
    give its ops IREE's CPU code generation attributes)."""
    return all(t is Target.CPU for t in targets)


def target_arch(options: Options, target: Target) -> str:
    """The device model option of `target` (cpu, cuda_arch, vulkan_target, rocm_chip)."""
    return getattr(options, spec(target).arch_option)


def check_compiled_in(targets: tuple[Target, ...]) -> None:
    """Raise OptionsError when this iree-compile lacks the backend of a target."""
    backends = compiled_in_backends()
    missing = [t for t in targets if spec(t).backend not in backends]
    if missing:
        available = [t.value for t, s in SPECS.items() if s.backend in backends]
        raise OptionsError(
            "target", missing[0].value, available,
            message=f"target {missing[0].value!r} needs IREE's '{spec(missing[0]).backend}' compiler backend, which "
                    f"this iree-compile was built without (it has: {', '.join(backends) or 'none'}); "
                    f"targets available: {', '.join(available)}")


# Element types a target computes wrongly or not at all in IREE 3.13 (docs/targets.md):
# the graph falls back to eager rather than give wrong results.
_TENSOR_TYPE = re.compile(r"vtensor<\[[^\]]*\],(\w+)>")


def unsupported_types(options: Options, target: Target) -> tuple[str, ...]:
    if target is Target.VULKAN:
        from tori.targets import vulkan

        return vulkan.unsupported_types(target_arch(options, target))
    return ()


def check_element_types(ir: str, options: Options, graph: str) -> None:
    used = set(_TENSOR_TYPE.findall(ir))
    for target in compiled_targets(options):
        bad = sorted(used.intersection(unsupported_types(options, target)))
        if bad:
            arch = target_arch(options, target)
            if target is Target.VULKAN:
                from tori.targets import vulkan

                arch = vulkan.resolve(arch)
            raise CompileError(f"{', '.join(bad)} tensors are not supported on target '{target.value}' "
                               f"(its device model, {spec(target).arch_option}={arch!r}, gives wrong results or "
                               f"none for them)", stage="iree", graph=graph)


# A module run in this process takes the memory of its intermediate values as its last
# argument (runtime/scratch.py) instead of allocating it on every call; an exported
# artifact keeps IREE's plain calling convention.
SCRATCH_FLAG = "--iree-torch-externalize-transients"


def in_process_flags(options: Options) -> tuple[str, ...]:
    """The flags of a module compiled for `options.target` to run in this process: on
    the CPU, scratch memory passed in (page faults of fresh heap memory per call otherwise)."""
    return (SCRATCH_FLAG,) if options.target is Target.CPU else ()


# How iree-compile refuses to take a module's transients as an argument: sizes that
# depend on values (a boolean mask's index_put), some dynamic shapes (Swin's windows).
# Such a module is compiled again to allocate its own.
_SCRATCH_REFUSALS = ("failed to hoist transient size computations",
                     "explicit execution regions must only contain explicit ops")


def invocation(options: Options, target: Target, extra: tuple[str, ...] = (),
               codegen: Strategy | None = None, text_between: bool = False, groups: int = 1) -> IreeInvocation:
    """iree-compile for `target`: its flags, the code generation strategy's, the user's, then `extra`."""
    chosen = codegen.flags_for(target) if codegen is not None else ()
    return IreeInvocation(tuple(compile_flags(target, target_arch(options, target), chosen + options.iree_flags + extra)),
                          text_between, groups)


# A CPU module's executables are compiled in one group per core the compile may use
# (targets/executable_groups.py; at most MAX_EXECUTABLE_GROUPS), the module handed to the
# grouping as text. Compiled linked, as IREE links them: a module that holds its weights
# (an artifact without external weights: larger than GROUPED_INPUT_LIMIT), and one of a
# few ops (smaller than GROUPED_INPUT_MIN: a 3-layer MLP's 6 KB compiled in 0.90 s either
# way; the benchmarks' CNN, 38 KB, in 1.19 s grouped against 1.27 linked).
MAX_EXECUTABLE_GROUPS = 8
GROUPED_INPUT_LIMIT = 16 << 20
GROUPED_INPUT_MIN = 16 << 10


def executable_groups(target: Target, bytecode: bytes) -> int:
    if target is not Target.CPU or not GROUPED_INPUT_MIN <= len(bytecode) <= GROUPED_INPUT_LIMIT:
        return 1
    return min(len(os.sched_getaffinity(0)), MAX_EXECUTABLE_GROUPS)


log = logging.getLogger("tori.compile")


def compile_with_strategy(bytecode: bytes, options: Options, target: Target, strategy: Strategy | None, *,
                          graph: str, extra: tuple[str, ...] = ()) -> tuple[bytes, IreeInvocation, Strategy | None]:
    """iree-compile for `target` with the code generation strategy's flags; where they
    make IREE fail, once more with IREE's other data-tiling path if the strategy
    data-tiles, then with IREE's defaults (a warning each): a rule is a speed choice
    and must never cost a graph its compile. Returns the vmfb, the invocation that made
    it and the strategy it used. The one way every path (torch.compile, every target of
    a multi-target compile, export) compiles a module."""
    groups = executable_groups(target, bytecode)
    current = invocation(options, target, extra, strategy, groups=groups)
    while True:
        try:
            return run_iree_compile(bytecode, current, graph=graph, timeout_s=options.compile_timeout_s), current, strategy
        except CompileError as error:
            # An op IREE cannot lower, or a compile killed (past its time limit, or repeating
            # a diagnostic without end), fails with any flags.
            hopeless = isinstance(error, UnsupportedOpError) or error.reason.endswith("killed)")
            if GROUPING_FAILED in error.reason and current.linked() is not None:
                log.info("tori: graph %s: %s; its executables are compiled linked", graph, error.reason)
                groups, current = 1, current.linked()
                continue
            if unserializable(error) and current.as_text_between() is not None:
                log.info("tori: graph %s: %s; iree-compile's phases hand the module on as text", graph, error.reason)
                current = current.as_text_between()
                continue
            if SCRATCH_FLAG in extra and any(refusal in error.reason for refusal in _SCRATCH_REFUSALS):
                log.info("tori: graph %s: iree-compile failed with scratch memory passed in (%s); compiling it to "
                         "allocate its own", graph, error.reason)
                extra = tuple(flag for flag in extra if flag != SCRATCH_FLAG)
                current = invocation(options, target, extra, strategy, current.text_between, groups)
                continue
            if strategy is None or not strategy.flags_for(target) or hopeless:
                error.invocation = current  # for the repro command
                raise
            failed = strategy
            strategy = failed.other_data_tiling_path(target, error.reason) \
                or failed.without_rules(f"iree-compile failed with them: {error.reason}")
            log.warning("tori: graph %s: iree-compile failed with the code generation flags for %s (%s); compiling "
                        "with %s", graph, failed, error.reason,
                        "IREE's global-optimization data tiling" if strategy.rules else "IREE's defaults")
            current = invocation(options, target, extra, strategy, current.text_between, groups)


class OtherTargets:
    """The compiles of every target but the first, started at once in the background."""

    def __init__(self, bytecode: bytes, options: Options, graph: str, ir: str = "", codegen: Strategy | None = None):
        targets = compiled_targets(options)
        check_compiled_in(targets)
        check_element_types(ir, options, graph)
        others = targets[1:]
        self._pool = None
        self._futures: dict[Target, concurrent.futures.Future] = {}
        if others:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(len(others), os.cpu_count() or 1))
            self._futures = {t: self._pool.submit(compile_with_strategy, bytecode, options, t, codegen,
                                                  graph=f"{graph}-{t.value}") for t in others}

    def result(self) -> dict[Target, bytes]:
        """Each target's vmfb; the first failure is raised (a CompileError naming the target)."""
        try:
            return {target: future.result()[0] for target, future in self._futures.items()}
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
