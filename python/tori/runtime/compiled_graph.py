"""The per-call path of a compiled graph: torch tensors in, IREE invoke, torch
tensors out, without copies on the CPU (DLPack both ways).

The path is hot: it does no validation that Dynamo's guards already guarantee,
and no logging.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from dataclasses import dataclass, field

import iree.runtime as rt
import numpy as np
import torch
from torch.utils.dlpack import to_dlpack

from tori.errors import ToriRuntimeError, runtime_check_error
from tori.frontend.signature import ArgKind, GraphSignature
from tori.runtime import huge_pages as pages
from tori.runtime import transfer
from tori.runtime.module import LoadedModule
from tori.runtime.seed import SeedSource
from tori.stats import counters
from tori.targets import Target, spec

_DL_CPU = 1  # DLPack device type code of host memory
# How IREE reports a failed `torch.runtime.assert`: "...FAILED_PRECONDITION; <message>; \n[ 0] bytecode ...".
_FAILED_CHECK = re.compile(r"FAILED_PRECONDITION; (.*?);\s*(?:\n|$)")
# DLPack device type codes of the GPU targets whose devices exchange tensors with torch.
_DL_DEVICE = {Target.CUDA: 2, Target.ROCM: 10}
_IREE_HEAP_ALIGNMENT = 64  # bytes; IREE refuses to import host memory aligned less
_PUSHED = frozenset((ArgKind.TENSOR, ArgKind.WRITTEN_TENSOR, ArgKind.UPDATED_TENSOR, ArgKind.STATIC_TENSOR,
                     ArgKind.INT, ArgKind.FLOAT))  # argument kinds passed to IREE (`_pack`)

# Calls spent timing each driver when the driver is chosen by measurement, in blocks of
# TRIAL_BLOCK_CALLS consecutive calls on one driver, the drivers' blocks alternating;
# the first call of each block is a warm-up and is not counted. A call is timed from
# its start to the start of the graph's next call, and the median decides: the blocks
# alternate, so a neighbour slows both drivers alike, while what local-task costs
# beyond the call is counted. Its threads slow the caller's own work between
# calls: in transformers' generate loop, the Python work around a weight-only int8
# Llama decoding step took 2.46 ms per token after local-task steps, 1.72 after
# local-sync ones, and a token 5.75 against 4.74 ms. Timed alone, the step chose
# local-task (fastest calls 1.57 against 2.06 ms, medians 2.10 against 2.54); timed
# to the next call, local-sync (medians 4.02 against 4.22 ms; float32 7.30 against
# 11.07).
TRIAL_CALLS_PER_DRIVER = 6
# A block's calls run as a stretch on one driver does: each driver's module packs its
# own copy of the resident weights, and calls alternating one by one read the two
# copies in turn. A Llama decoding step (113 MB of weights, Intel Xeon, 2026-12-07) ran
# its IREE invocation in 3.2-4.6 ms on local-task and 4.5-7.0 on local-sync in stretches
# of one driver, 5.2-6.7 and 5.8-8.3 alternating one by one. Its trials, then whole
# generate() runs on each driver in turn in the same process (ms a token): alternating
# calls, first-round medians 9.86 on local-sync against 6.21 on local-task, 10.36
# against 8.54, 13.79 against 12.51, 10.39 against 10.65, 11.62 against 7.79 (local-task
# chosen twice), while local-sync's tokens took 1.06-1.42x local-task's in all five
# (8.00 against 7.06, 9.37 against 8.08, 12.36 against 8.69, 11.43 against 8.98, 9.21
# against 8.67); in blocks of three, both rounds' medians 1.32, 1.38, 1.20 and 1.49x
# apart for local-task (chosen three times), its tokens 1.23, 1.23, 1.14 and 1.28x faster.
TRIAL_BLOCK_CALLS = 3
# Calls on the driver chosen first before the drivers are timed once more; the median
# call over both rounds then decides for good. A first round disturbed by a neighbour
# or by the compile that just ended (inductor's compile workers, iree-compile) is
# corrected by the second.
REVIEW_AFTER_CALLS = 100
# A gap that settles the choice for good after DECISIVE_CALLS timed calls of each
# driver: every timed call of the others at least DECISIVE_RATIO times the slowest of
# the fastest one's, and DECISIVE_SECONDS or longer. Long calls are where trials cost:
# a batch-8 BERT's call took 295-358 ms on local-task and 501-631 on local-sync, so
# the six local-sync trial calls and the review's six cost about 3 s; a neighbour's
# noise does not double calls that long.
DECISIVE_CALLS = 2
DECISIVE_RATIO = 1.5
DECISIVE_SECONDS = 0.02
# For short calls (the faster driver's median period under MARGIN_BELOW_SECONDS) another
# driver is chosen over the target's first (targets/__init__.py: local-sync, then
# local-task on the CPU) only where its median period is LOCAL_TASK_MARGIN times
# shorter: there local-task's trial periods show less than it costs the rest of the process. A
# Llama decoding step (resident weights in huge pages, benchmarks/bench_models.py's
# decoding rows, 2026-12-06): trial medians of 6-9 ms within 0.6-14% of each other,
# local-task's the shorter in 8 of 20 trials, but a token took 7.78-8.17 ms with
# local-task pinned against 6.67-6.94 with local-sync, and 8.29 against 6.79 with both
# loaded and switched between in the same process. Long calls are where local-task's
# threads pay and where a neighbour's work (inductor's compile workers just after a
# compile) slows its trial calls most: MobileNetV3 at 8 images timed 76.2 ms on
# local-sync and 71.4 on local-task in a first round, and ran 73.4 ms a call on
# local-sync against 56.0 on local-task in the run before. The decoding step's trial
# ratios (local-sync's median over local-task's) in 34 kept choices of the decoding rows were
# 0.69-1.26, and at 1.26 (2026-12-07) the step took 7.47 ms a token on local-task against
# 6.79 on local-sync in the run before; every graph of real compute under 20 ms chose
# local-task by 1.40 or more (MobileNetV3 at one image 1.40 and 1.45, EfficientNet-B0
# 1.57 and 1.66, the T5 encoder 1.83 and 1.87). Those trials alternated call by call
# (an AMD EPYC); the margin was 1.3 then. Timed in blocks (TRIAL_BLOCK_CALLS) on an Intel
# Xeon (2026-12-07), the decoding row's step (`bench_models.py --models llama_decode
# --no-inductor`, three runs each) timed local-task 1.13, 1.15 and 1.22x shorter, kept
# local-sync at 1.3 and ran at 0.83, 0.90 and 0.77x eager's speed a token; with 1.1 it
# timed 1.47, 1.16 and 1.60x, chose local-task and ran at 0.85, 1.04 and 0.92x.
LOCAL_TASK_MARGIN = 1.1
MARGIN_BELOW_SECONDS = 0.02
# Calls after which the driver choice is final: the first call (untimed, on the target's
# `first_calls_driver`), two rounds of trials with the review's calls between, and the
# call after the last timed one, which ends its period and settles.
SETTLED_AFTER_CALLS = 1 + 2 * TRIAL_CALLS_PER_DRIVER + REVIEW_AFTER_CALLS + 2 * TRIAL_CALLS_PER_DRIVER + 1
# Seconds this thread has spent in trial calls of any graph: a graph's trial period
# leaves out the trial calls of other graphs within it. Two graphs called in turn
# whose trials had started one call apart each timed its local-task calls with the
# other's local-sync ones: the calls' sums tied, and one of two copies of ResNet-18
# at 8 images settled on local-sync, 446 ms a call against its twin's 240.
_TRIALS = threading.local()


def _trial_seconds() -> float:
    return getattr(_TRIALS, "seconds", 0.0)


@dataclass
class DriverChoice:
    driver: str
    reason: str
    median_us: dict[str, float] = field(default_factory=dict)
    final: bool = True  # False between the first round of timed calls and the review


class CompiledGraph:
    """A vmfb plus the signature that maps Python values onto its `main` function."""

    def __init__(self, name: str, vmfb: bytes, signature: GraphSignature, drivers: tuple[str, ...],
                 static_args: frozenset[int] = frozenset(), *, target: Target = Target.CPU,
                 device_index: int | None = None, huge_pages: bool = False):
        self.name = name
        self.target = target
        # Vulkan reads no torch memory in place: inputs and results are copied (runtime/transfer.py).
        self._staged = target is Target.VULKAN
        self._dl_device = (_DL_DEVICE[target], device_index or 0) if target in _DL_DEVICE else (_DL_CPU, 0)
        self._device_index = device_index
        self.signature = signature
        # Per argument: how it is passed, and for parameters and buffers (static_args)
        # a slot caching the imported buffer of the tensor last seen there.
        self._arg_kinds = tuple(
            ArgKind.STATIC_TENSOR if kind is ArgKind.TENSOR and i in static_args else kind
            for i, kind in enumerate(signature.args)
        )
        self._static_slots: list[tuple | None] = [None] * len(signature.args)
        # Random ops take a seed drawn per call, an argument after the caller's.
        seed_device = torch.device("cuda", device_index or 0) if target in _DL_DEVICE else torch.device("cpu")
        self._seed = SeedSource(seed_device) if ArgKind.SEED in signature.args else None
        # Per result: IREE's index, the constant, the dtype, the UPDATED_TENSOR argument it is the new value of.
        self._results = tuple((r.index, r.value, r.dtype, r.updates) for r in signature.results)
        self._num_results = signature.num_iree_results
        self._vmfb = vmfb
        # Resident weights (frontend/resident.py): the modules are loaded with the tensors
        # of the first call, and again whenever one of them changes.
        self._resident = tuple(i for i, kind in enumerate(signature.args) if kind is ArgKind.RESIDENT)
        self._loaded_weights: tuple = ()
        self._load_lock = threading.Lock()
        # The packed weights' memory collapsed into 2 MiB pages after each load (runtime/huge_pages.py).
        self._huge_pages = huge_pages
        self.page_collapse: pages.Collapse | None = None  # the last load's
        # The VM arguments of a call: what `_pack` pushes.
        self._vm_arguments = sum(kind in _PUSHED for kind in self._arg_kinds) + (self._seed is not None)
        self._drivers = tuple(drivers)
        # Each driver's module is loaded when a call first needs it (`_module`), with the
        # weights of the last load (`_weight_index`). The graph's first call runs on
        # `_untimed` alone: the others load at the call after it, before they are timed.
        first = spec(target).first_calls_driver
        self._untimed = first if first in self._drivers else self._drivers[0]
        self._first_call_done = False
        self._weight_index: rt.ParameterIndex | None = None
        self._modules: dict[str, LoadedModule] = {} if self._resident else {self._untimed: self._load(self._untimed)}
        if len(drivers) == 1:
            self.driver_choice = DriverChoice(drivers[0], "set by the 'driver' option")
            self._active = self._modules.get(drivers[0])
            self._call = self._call_active
        else:
            self.driver_choice = None
            self._trials = self._round_order()
            self._timings: dict[str, list[float]] = {d: [] for d in drivers}
            self._timed: tuple[str, float] | None = None  # the trial call whose period runs
            # At the round's first call: collapses begun, and each driver's timings before it.
            self._round: tuple[int, dict[str, int]] = (0, {})
            self._trial_lock = threading.Lock()
            self._until_review = REVIEW_AFTER_CALLS
            self._call = self._call_measuring

    @property
    def driver(self) -> str | None:
        return self.driver_choice.driver if self.driver_choice else None

    # AOTAutograd calls compiled graphs with one list of arguments ("boxed").
    _boxed_call = True

    def __call__(self, args):
        if self._resident and not self._weights_current(args):
            self._load_weights(args)
        return self._call(args)

    def run(self, *args):
        """Call with positional arguments, as the ATen graph's placeholders are ordered."""
        return self(args)

    def _weights_current(self, args) -> bool:
        loaded = self._loaded_weights
        if not loaded:
            return False
        for (i, tensor, version, address) in loaded:
            value = args[i]
            if value is not tensor or value._version != version or value.data_ptr() != address:
                return False
        return True

    def parameters(self, args) -> dict[str, np.ndarray]:
        """The module's parameters for a call with `args`, by name, as bytes: its
        resident tensors, and the values its weight prologue derives from them."""
        from tori.frontend.resident import parameter_name
        from tori.frontend.weight_prologue import derived_name

        def raw(value: torch.Tensor) -> np.ndarray:
            return value.detach().contiguous().reshape(-1).view(torch.uint8).numpy() if value.numel() else \
                np.zeros(0, np.uint8)

        found = {parameter_name(i): raw(args[i]) for i in self._resident}
        if self.signature.prologue is not None:
            found.update((derived_name(n), raw(v)) for n, v in enumerate(self.signature.prologue.run(args)))
        return found

    def _load_weights(self, args) -> None:
        """(Re)load the modules loaded so far (the first call's, when none) with the
        resident tensors of `args` as their parameters."""
        with self._load_lock:
            if self._weights_current(args):
                return  # another thread loaded them meanwhile
            index = rt.ParameterIndex()
            arrays = self.parameters(args)
            for name, array in arrays.items():
                index.add_buffer(name, array)
            self._weight_index = index
            self._modules = {d: self._load(d) for d in tuple(self._modules) or (self._untimed,)}
            if self.driver_choice is not None:
                self._active = self._modules[self.driver_choice.driver]
            self._weight_arrays = arrays  # the host memory the parameters were read from
            self._loaded_weights = tuple((i, args[i], args[i]._version, args[i].data_ptr()) for i in self._resident)

    def _load(self, driver: str) -> LoadedModule:
        """The module on `driver`, with the weights of the last load; the memory they
        were packed into collapsed into 2 MiB pages after it (runtime/huge_pages.py)."""
        from tori.frontend.resident import SCOPE

        index = self._weight_index
        before = pages.snapshot() if self._huge_pages and index is not None else None
        module = LoadedModule(self._vmfb, driver, device_index=self._device_index, parameters=index,
                              scope=SCOPE if index is not None else "", arguments=self._vm_arguments)
        if before is not None:
            self.page_collapse = pages.collapse_new(before)
        return module

    def _module(self, driver: str) -> LoadedModule:
        """The module on `driver`, loaded on first use."""
        module = self._modules.get(driver)
        if module is None:
            with self._load_lock:
                module = self._modules.get(driver)
                if module is None:
                    module = self._load(driver)
                    self._modules = {**self._modules, driver: module}
        return module

    def _untimed_call(self) -> bool:
        """Whether a call before a round of timed calls runs untimed, on `_untimed`: the
        graph's first call (no other driver's module is loaded for it), and any call
        while weights' pages are being collapsed (this graph's or another's, which
        loaded just before: that work shares the cores). The call after the first loads
        the modules of the other drivers."""
        if not self._first_call_done:
            self._first_call_done = True
            return True
        for driver in self._drivers:
            self._module(driver)
        return pages.collapsing()

    def _call_active(self, args):
        counters.compiled_calls += 1
        return self._run(self._active, args)

    def _call_measuring(self, args):
        # Trials run one at a time, so that threads calling the same graph neither
        # race for the trial list nor time each other's calls. A trial call is timed
        # from its start to the start of the graph's next call: local-task's threads
        # also slow the caller's own work between calls (see TRIAL_CALLS_PER_DRIVER).
        # Trial calls of other graphs in that period are not counted (`_TRIALS`).
        # Nothing here calls through `self._call`, which a caller may have wrapped.
        # The first call, and calls while weights' pages collapse, come before a round
        # starts and run untimed (`_untimed_call`).
        if self._timed is None and len(self._trials) == TRIAL_CALLS_PER_DRIVER * len(self._drivers) \
                and self._untimed_call():
            counters.compiled_calls += 1
            return self._run(self._module(self._untimed), args)
        with self._trial_lock:
            now = time.perf_counter()
            if self._timed is not None:
                driver, start, thread, others = self._timed
                # Other graphs' trial calls since, where this call comes on the thread that
                # made the timed one (each thread keeps its own count).
                between = _trial_seconds() - others if thread == threading.get_ident() else 0.0
                self._timings[driver].append(now - start - between)
                self._timed = None
                if self._round_disturbed():
                    counters.compiled_calls += 1
                    return self._run(self._module(self._untimed), args)
                if not self._trials:  # the round's last period: it is complete
                    self._settle()
                elif self._decisive():
                    self._trials = []
                    self._settle(decisive=True)
            if self._trials:
                if len(self._trials) == TRIAL_CALLS_PER_DRIVER * len(self._drivers):  # a round begins
                    self._round = (pages.collapses_begun(), {d: len(t) for d, t in self._timings.items()})
                counters.compiled_calls += 1
                driver = self._trials.pop(0)
                try:
                    return self._run(self._module(driver), args)
                finally:
                    _TRIALS.seconds = _trial_seconds() + time.perf_counter() - now
                    self._timed = (driver, now, threading.get_ident(), _trial_seconds())
        return self._call_until_review(args) if not self.driver_choice.final else self._call_active(args)

    def _round_order(self) -> list[str]:
        """The drivers of a round's calls, in order: blocks of TRIAL_BLOCK_CALLS, alternating."""
        return [d for _ in range(TRIAL_CALLS_PER_DRIVER // TRIAL_BLOCK_CALLS) for d in self._drivers
                for _ in range(TRIAL_BLOCK_CALLS)]

    def _round_disturbed(self) -> bool:
        """Whether weights' pages were collapsed while the round of timed calls ran (a
        load of this graph's or another's began one): the round's timings are then
        dropped, and the round runs again once no collapse runs (`_untimed_call`). The
        collapse takes a core, and local-task's calls want both. In a Llama decoding loop
        the prefill graph's modules load with the next generate(), while the decoding
        graph's first round runs: that round settled at the graph's 39th call with a
        collapse running all through it, on medians of 13.5 ms (local-sync) and 15.0
        (local-task), where the step's calls take 3.2-4.6 ms on local-task and 4.5-7.0 on
        local-sync in stretches of one driver."""
        begun, lengths = self._round
        if pages.collapses_begun() == begun and not pages.collapsing():
            return False
        for driver, times in self._timings.items():
            del times[lengths[driver]:]
        self._trials = self._round_order()
        return True

    def _call_until_review(self, args):
        self._until_review -= 1
        if self._until_review <= 0:
            with self._trial_lock:
                if not self._trials and self._timed is None and not self.driver_choice.final:
                    self._trials = self._round_order()
                    self._call = self._call_measuring
        return self._call_active(args)

    def _counted(self) -> dict[str, list[float]]:
        # The first call of each block warms its driver up and is not counted.
        return {d: [t[i] for i in range(len(t)) if i % TRIAL_BLOCK_CALLS] for d, t in self._timings.items()}

    def _decisive(self) -> bool:
        """Whether the timed calls so far show one driver far faster (DECISIVE_RATIO)."""
        counted = self._counted()
        if any(len(times) < DECISIVE_CALLS for times in counted.values()):
            return False
        best = min(counted, key=lambda d: max(counted[d]))
        others = [t for d, times in counted.items() if d != best for t in times]
        return min(others) >= max(max(counted[best]) * DECISIVE_RATIO, DECISIVE_SECONDS)

    def _settle(self, decisive: bool = False) -> None:
        counted = self._counted()
        median = {d: statistics.median(times) * 1e6 for d, times in counted.items()}
        best = min(median, key=median.get)
        preferred = self._drivers[0]  # the target's first driver (targets/__init__.py: local-sync on the CPU)
        if best != preferred and median[best] < MARGIN_BELOW_SECONDS * 1e6 \
                and median[preferred] < median[best] * LOCAL_TASK_MARGIN:
            best = preferred
        final = decisive or self.driver_choice is not None
        timings = ", ".join(f"{d} {us:.1f} us" for d, us in sorted(median.items()))
        count = min(len(times) for times in counted.values())
        reason = f"median of {count} timed calls each: {timings}" + \
            (f" (one driver {DECISIVE_RATIO}x faster or more: decided for good)" if decisive else "")
        self.driver_choice = DriverChoice(best, reason, median, final)
        self._active = self._modules[best]
        if final:
            self._modules = {best: self._active}
            self._call = self._call_active
            self._timings = {}
        else:
            self._call = self._call_until_review

    def _static_buffer(self, i: int, value: torch.Tensor, device):
        # A parameter is the same tensor call after call: its imported buffer is reused
        # until the tensor, its storage or its version (any in-place update) changes.
        slot = self._static_slots[i]
        if _current(slot, value, device):
            return slot[4], slot[5]
        imported, address = _importable(value)
        buffer = device.from_dlpack_capsule(to_dlpack(imported))
        self._static_slots[i] = (value, value._version, value.data_ptr(), device, buffer, address)
        return buffer, address

    def _invoke(self, module: LoadedModule, packed, sizing=None):
        try:
            return module.invoke(packed, self._num_results, sizing)
        except (ValueError, RuntimeError, IndexError) as error:
            check = _FAILED_CHECK.search(str(error))
            if check:  # a `torch.runtime.assert` compiled into the module: the inputs' fault
                message = check.group(1)
                raise runtime_check_error(message)(f"compiled graph '{self.name}': {message}") from error
            raise ToriRuntimeError(
                f"compiled graph '{self.name}' failed on IREE's {module.driver} driver: {error}. "
                "If guards were filtered (guard_filter_fn), inputs may no longer match the shapes it was "
                "compiled for; otherwise compile with options={'fallback': 'error'} and report it."
            ) from error

    def scratch_bytes(self, args) -> int | None:
        """The scratch bytes (runtime/scratch.py) a call with `args` takes on the driver
        in use, None when the module allocates its own."""
        module = self._modules.get(self.driver) if self.driver else next(iter(self._modules.values()), None)
        if module is None or module.scratch is None:
            return None
        return module.scratch.bytes_for(self._pack(module, args)[0] if module.scratch.size is None else None)

    def _run(self, module: LoadedModule, args):
        if self.signature.input_checks is not None:
            self.signature.input_checks.verify(args, self.name)
        if self._staged:
            return self._run_staged(module, args)
        if self._dl_device[0] != _DL_CPU:
            # IREE's queue does not wait for work torch queued on its own stream.
            torch.cuda.current_stream(self._dl_device[1]).synchronize()
        packed, taken, in_place = self._pack(module, args)
        scratch = module.scratch
        # A scratch size that depends on the shapes is asked of the module with the same arguments.
        sizing = self._pack(module, args)[0] if scratch is not None and scratch.size is None else None
        results = self._invoke(module, packed, sizing)
        export_tensor = module.device.create_dlpack_capsule
        outputs = []
        for index, value, dtype, updates in self._results:
            if index is None:
                outputs.append(value)
            elif dtype is None:
                outputs.append(results.get_variant(index))
            else:
                tensor = torch.from_dlpack(export_tensor(results.get_as_object(index, rt.HalBufferView), *self._dl_device))
                address = tensor.data_ptr()
                if updates is not None and in_place.get(updates) == address and args[updates].dtype == dtype:
                    # IREE wrote the new value into the argument: hand back the argument itself,
                    # which AOTAutograd's copy back then skips.
                    tensor = args[updates]
                    in_place.pop(updates)
                elif address in taken:
                    tensor = tensor.clone()
                else:
                    taken.add(address)
                if tensor.dtype is not dtype:
                    tensor = _as_dtype(tensor, dtype)
                outputs.append(tensor)
        return outputs

    def _pack(self, module: LoadedModule, args):
        """The VM arguments of a call, the addresses of the host memory IREE reads in
        place, and the UPDATED_TENSOR arguments imported in place (index -> address)."""
        packed = rt.VmVariantList(len(args) + 1)
        import_tensor = module.device.from_dlpack_capsule
        # IREE hands back an argument's buffer for a result that folds to it (a clone,
        # a reshape), and one buffer for equal results: such a result must be copied out.
        taken = set()
        in_place = {}
        for i, (kind, value) in enumerate(zip(self._arg_kinds, args)):
            if kind is ArgKind.TENSOR or kind is ArgKind.WRITTEN_TENSOR or kind is ArgKind.UPDATED_TENSOR:
                value, address = _importable(value.clone() if kind is ArgKind.WRITTEN_TENSOR else value)
                taken.add(address)
                if kind is ArgKind.UPDATED_TENSOR and address == args[i].data_ptr():
                    in_place[i] = address
                packed.push_ref(import_tensor(to_dlpack(value)))
            elif kind is ArgKind.STATIC_TENSOR:
                buffer, address = self._static_buffer(i, value, module.device)
                taken.add(address)
                packed.push_ref(buffer)
            elif kind is ArgKind.INT:
                packed.push_int(int(value))
            elif kind is ArgKind.FLOAT:
                packed.push_float(float(value))
        if self._seed is not None:
            packed.push_ref(self._seed.buffer(module.device))
        return packed, taken, in_place

    def _run_staged(self, module: LoadedModule, args):
        device = module.device
        packed = rt.VmVariantList(len(args))
        for i, (kind, value) in enumerate(zip(self._arg_kinds, args)):
            if kind is ArgKind.TENSOR or kind is ArgKind.WRITTEN_TENSOR or kind is ArgKind.UPDATED_TENSOR:
                packed.push_ref(transfer.upload(device, value))
            elif kind is ArgKind.STATIC_TENSOR:
                # Parameters are copied to the device once, again only when they change.
                slot = self._static_slots[i]
                if not _current(slot, value, device):
                    slot = (value, value._version, value.data_ptr(), device, transfer.upload(device, value), None)
                    self._static_slots[i] = slot
                packed.push_ref(slot[4])
            elif kind is ArgKind.INT:
                packed.push_int(int(value))
            elif kind is ArgKind.FLOAT:
                packed.push_float(float(value))
        if self._seed is not None:
            packed.push_ref(transfer.upload(device, self._seed.draw()))
        results = self._invoke(module, packed)
        outputs = []
        for index, value, dtype, _ in self._results:
            if index is None:
                outputs.append(value)
            elif dtype is None:
                outputs.append(results.get_variant(index))
            else:
                outputs.append(transfer.download(device, results.get_as_object(index, rt.HalBufferView), dtype))
        return outputs


def _current(slot, value: torch.Tensor, device) -> bool:
    """Whether a parameter's cached buffer still holds `value`: the same tensor, storage
    and version (any in-place update bumps it), on the same device."""
    return slot is not None and slot[0] is value and slot[1] == value._version \
        and slot[2] == value.data_ptr() and slot[3] is device


def _importable(value: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`value` as host memory IREE can import in place (dense, and aligned as
    IREE's heap buffers must be), and the address of that memory."""
    if value.requires_grad:
        value = value.detach()
    if value.is_conj():  # DLPack exports no conjugate bit
        value = value.resolve_conj()
    address = value.data_ptr()
    if address % _IREE_HEAP_ALIGNMENT or not value.is_contiguous():
        value = value.clone(memory_format=torch.contiguous_format)
        address = value.data_ptr()
    return value, address


def _as_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # IREE has signless integers: an unsigned result comes back as the signed type
    # of the same width, which a bit-for-bit view restores.
    if tensor.element_size() == dtype.itemsize:
        return tensor.view(dtype)
    return tensor.to(dtype)
