"""The Python heap that exists when Dynamo starts a compile is left out of the cyclic
garbage collector's scans until the compile ends (`gc.freeze`, then `gc.unfreeze`).

A compile allocates millions of objects (Dynamo's variable trackers, fake tensors, FX
nodes, AOTAutograd's traces, tori's MLIR), and the collector's full collections that
they trigger scanned every object of the process: torch's modules, the model's, the
caller's. In a first call of ResNet-18 at one image, the two full collections took 0.21
and 0.27 s of its 6 s (0.5-1.4 s of collection over the benchmarks' real models,
benchmarks/bench_models.py). Frozen, a collection scans only what the compile made, and
garbage the compile makes is still collected. First calls in fresh processes, two
rounds each, without and with (s): ResNet-18 at one image 6.46, 6.14 against 6.19,
5.88; MobileNetV3 10.92, 11.20 against 10.55, 10.35; BERT 5.68, 5.45 against 5.36, 5.17
(docs/performance.md).

Every Dynamo compile of the process is covered (Dynamo's start and end callbacks know
no backend), an inductor compile beside tori's included. A process that froze objects
of its own (before a fork, to share pages) or turned the collector off manages its heap
itself: nothing is frozen or unfrozen for it.
"""

from __future__ import annotations

import gc
import threading

from torch._dynamo.callback import CallbackArgs, callback_handler

_lock = threading.Lock()
_frozen = False  # whether this module froze the heap (and so unfreezes it)


def _compile_started(_: CallbackArgs) -> None:
    global _frozen
    with _lock:
        if _frozen or not gc.isenabled() or gc.get_freeze_count():
            return
        gc.freeze()
        _frozen = True


def _compile_ended(_: CallbackArgs) -> None:
    global _frozen
    with _lock:
        if _frozen:
            _frozen = False
            gc.unfreeze()


def install() -> None:
    """Freeze the heap for each Dynamo compile from now on. `torch._dynamo.reset()`
    drops every callback: the backend installs them again on its next graph (the
    compiles after it are covered) and `tori.compiler.reset()` at once."""
    with _lock:
        if _compile_started not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(_compile_started)
        if _compile_ended not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(_compile_ended)
