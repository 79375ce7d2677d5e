"""The heap is left out of the garbage collector's scans while Dynamo compiles
(frontend/compile_heap.py), and handed back when the compile ends; a process that froze
objects itself, or turned the collector off, keeps its own state."""

import gc
from contextlib import contextmanager

import torch

import tori
from torch._dynamo.callback import callback_handler
from tori.testing import count_graphs


@contextmanager
def freeze_counts_seen_by_the_compile():
    """The collector's frozen object count that a Dynamo start callback registered after
    tori's sees, one per compile."""
    seen: list[int] = []

    def record(_):
        seen.append(gc.get_freeze_count())

    callback_handler.register_start_callback(record)
    try:
        yield seen
    finally:
        callback_handler.remove_start_callback(record)


def _compile_and_check(scale: float) -> None:
    def f(x):
        return torch.sin(x) * scale + x

    x = torch.randn(16, 8)
    with count_graphs() as graphs:
        out = torch.compile(f, backend="tori", options={"fallback": "error", "cache": False})(x)
    torch.testing.assert_close(out, f(x))
    assert graphs.delta.compiled_graphs == 1 and not graphs.delta.fallback_graphs


def test_the_heap_is_frozen_while_a_compile_runs_and_handed_back_after():
    tori.compiler.reset()  # torch's reset drops Dynamo's callbacks; tori's installs them again
    assert gc.get_freeze_count() == 0
    with freeze_counts_seen_by_the_compile() as seen:
        _compile_and_check(1.5)
    assert len(seen) == 1 and seen[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_heap_frozen_by_the_process_or_a_collector_turned_off_is_left_as_it_is():
    tori.compiler.reset()
    gc.freeze()
    try:
        own = gc.get_freeze_count()
        with freeze_counts_seen_by_the_compile() as seen:
            _compile_and_check(2.5)
        # Objects frozen by the process may be freed meanwhile; none were added or thawed.
        assert len(seen) == 1 and 0 < seen[0] <= own and 0 < gc.get_freeze_count() <= own
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with freeze_counts_seen_by_the_compile() as seen:
            _compile_and_check(3.5)
        assert seen == [0] and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_compiles_after_torchs_own_reset_are_covered_from_the_second_one():
    torch._dynamo.reset()
    _compile_and_check(4.5)  # the backend installs the callbacks again, during this compile
    with freeze_counts_seen_by_the_compile() as seen:
        _compile_and_check(5.5)
    assert len(seen) == 1 and seen[0] > 0 and gc.get_freeze_count() == 0
