"""The `iree` stage for several targets at once: one torch-dialect module, one
iree-compile per target, run side by side (each is its own child process).
"""

from __future__ import annotations

import concurrent.futures
import os
import re

from tori.config import Options
from tori.errors import CompileError, OptionsError
from tori.targets import SPECS, Target, spec
from tori.targets.codegen import Strategy
from tori.targets.iree_compile import IreeInvocation, compile_flags, compiled_in_backends, run_iree_compile


def compiled_targets(options: Options) -> tuple[Target, ...]:
    """Every target a graph is compiled for: `target` first, then `targets`."""
    return tuple(dict.fromkeys((options.target, *options.targets)))


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


def invocation(options: Options, target: Target, extra: tuple[str, ...] = (),
               codegen: Strategy | None = None) -> IreeInvocation:
    """iree-compile for `target`: its flags, the code generation strategy's, the user's, then `extra`."""
    chosen = codegen.flags_for(target) if codegen is not None else ()
    return IreeInvocation(tuple(compile_flags(target, target_arch(options, target), chosen + options.iree_flags + extra)))


class OtherTargets:
    """The compiles of every target but the first, started at once in the background."""

    def __init__(self, bytecode: bytes, options: Options, graph: str, ir: str = "", codegen: Strategy | None = None):
        targets = compiled_targets(options)
        check_compiled_in(targets)
        check_element_types(ir, options, graph)
        self.invocations = {t: invocation(options, t, codegen=codegen) for t in targets[1:]}
        self._pool = None
        self._futures: dict[Target, concurrent.futures.Future] = {}
        if self.invocations:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(len(self.invocations), os.cpu_count() or 1))
            self._futures = {
                t: self._pool.submit(run_iree_compile, bytecode, inv, graph=f"{graph}-{t.value}",
                                     timeout_s=options.compile_timeout_s)
                for t, inv in self.invocations.items()}

    def result(self) -> dict[Target, bytes]:
        """Each target's vmfb; the first failure is raised (a CompileError naming the target)."""
        try:
            vmfbs = {}
            for target, future in self._futures.items():
                try:
                    vmfbs[target] = future.result()
                except CompileError as error:
                    error.invocation = self.invocations[target]  # for the repro command
                    raise
            return vmfbs
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
