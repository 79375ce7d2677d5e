"""Resident weights in 2 MiB pages (runtime/huge_pages.py): after a module loads, the
memory IREE packed its weights into is collapsed into transparent huge pages, and the
calls after it still match eager."""

import ctypes
import errno
import mmap
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

import tori
from tori.config import Options
from tori.errors import OptionsError
from tori.runtime import huge_pages
from tori.runtime.compiled_graph import TRIAL_BLOCK_CALLS, TRIAL_CALLS_PER_DRIVER
from tori.testing import count_graphs

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _anon_huge_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def _model():
    # 2 x 32 MiB of weights, packed at load by IREE's data tiling into memory that malloc
    # maps afresh (its pool serves chunks under 32 MiB from memory it may already hold).
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).eval()


@pytest.mark.skipif(not _THP.exists() or "[never]" in _THP.read_text(),
                    reason="this kernel has no transparent huge pages to collapse into")
def test_packed_weights_are_collapsed_into_huge_pages_and_still_match_eager():
    model, x = _model(), torch.randn(2, 2048)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "cache": False,
                                                             "huge_pages": True})
    with torch.no_grad(), count_graphs() as count:
        before = _anon_huge_bytes()
        first = compiled(x)
        collapse = tori.last_compile().graphs[0].compiled.page_collapse.join(timeout=60)
        assert collapse.regions, "no mapping appeared while the module loaded"
        assert collapse.collapsed >= 32 << 20 or set(collapse.refusals) <= {errno.EAGAIN, errno.ENOMEM}, collapse
        if collapse.collapsed < 32 << 20:  # the kernel had no free huge pages: not tori's to fix
            pytest.skip(f"the kernel refused the collapse ({collapse.refusals}): no free huge pages")
        assert _anon_huge_bytes() - before >= 32 << 20
        torch.testing.assert_close(first, model(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)  # read from the huge pages
    assert count.compiled_calls == 2 and count.fallback_calls == 0


def test_the_switch_leaves_the_pages_alone_and_a_mapping_seen_before_is_never_touched():
    model, x = _model(), torch.randn(2, 2048)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "cache": False,
                                                             "huge_pages": False})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert tori.last_compile().graphs[0].compiled.page_collapse is None
    assert huge_pages.collapse_new(huge_pages.snapshot()).join().regions == []
    with pytest.raises(OptionsError, match="huge_pages"):
        Options.from_mapping({"huge_pages": "sometimes"})
    assert Options.from_mapping({"huge_pages": "0"}).huge_pages is False and Options().huge_pages is True  # on by default


def test_driver_trials_wait_while_any_graphs_collapse_runs():
    """A graph's driver trial does not time calls while another graph's weights are being
    collapsed (that work shares the cores): its calls before the round stay untimed."""
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    gate = threading.Event()
    other = huge_pages.Collapse([])  # another graph's collapse, held running until the gate opens
    other._thread = threading.Thread(target=gate.wait, daemon=True)
    other._thread.start()
    with huge_pages._started_lock:
        huge_pages._started.append(other)
    try:
        assert huge_pages.collapsing()
        with count_graphs() as count:
            for _ in range(3):
                torch.testing.assert_close(compiled(x), x * 2 + 1)
        graph = tori.last_compile().forward.compiled
        assert graph.page_collapse is None  # this graph collapses nothing of its own
        assert graph._timed is None and not any(graph._timings.values())
        assert count.compiled_calls == 3
    finally:
        gate.set()
        other.join()
    assert not huge_pages.collapsing()
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert graph._timed is not None  # the round's first timed call


def test_a_collapse_during_a_driver_trial_round_drops_the_round():
    """Weights' pages collapsed while a round of timed calls runs (another graph's load
    began it): the collapse takes a core, so the round's timings are dropped and the
    round runs again, whole, once no collapse runs."""
    compiled = torch.compile(lambda x: x * 2 + 1, backend="tori", options={"fallback": "error"})
    x = torch.randn(8)
    for _ in range(3):  # the untimed first call, then the round's first two calls
        torch.testing.assert_close(compiled(x), x * 2 + 1)
    graph = tori.last_compile().forward.compiled
    assert graph._timed is not None and sum(map(len, graph._timings.values())) == 1
    before = huge_pages.snapshot()
    loaded = _Mapping(8 << 20, touched=True)  # as a module's packed weights appear at its load
    try:
        work = huge_pages.collapse_new(before)
        assert work.regions
        with count_graphs() as count:
            torch.testing.assert_close(compiled(x), x * 2 + 1)  # its period held the collapse
        assert count.compiled_calls == 1 and graph._timed is None and not any(graph._timings.values())
        assert len(graph._trials) == 2 * TRIAL_CALLS_PER_DRIVER
        work.join(timeout=60)
        while graph.driver_choice is None:
            torch.testing.assert_close(compiled(x), x * 2 + 1)
        counted = TRIAL_CALLS_PER_DRIVER - TRIAL_CALLS_PER_DRIVER // TRIAL_BLOCK_CALLS
        assert f"median of {counted} timed calls" in graph.driver_choice.reason
    finally:
        loaded.close()


_PROT_NONE = 0


class _Mapping:
    """A private anonymous mapping of `size` bytes between two inaccessible pages (so the
    kernel cannot merge it with a neighbour), touched or not."""

    def __init__(self, size: int, touched: bool):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._libc, self._total = libc, size + 2 * mmap.PAGESIZE
        base = libc.mmap(None, self._total, mmap.PROT_READ | mmap.PROT_WRITE,
                         mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        assert base not in (None, ctypes.c_void_p(-1).value)
        self._base = base
        for guard in (base, base + mmap.PAGESIZE + size):
            assert libc.mprotect(guard, mmap.PAGESIZE, _PROT_NONE) == 0
        self.start, self.end = base + mmap.PAGESIZE, base + mmap.PAGESIZE + size
        if touched:
            ctypes.memset(self.start, 1, size)

    def close(self):
        self._libc.munmap(self._base, self._total)


def _covered(regions, within) -> int:
    """How many bytes of `within` the collapsed `regions` cover."""
    return sum(max(0, min(end, within[1]) - max(start, within[0])) for start, end in regions)


def test_a_mapping_grown_while_a_module_loaded_has_only_its_new_part_collapsed():
    grown = _Mapping(24 << 20, touched=True)
    try:
        now = huge_pages.snapshot()
        assert (grown.start, grown.end) in now
        # As the heap's line reads after malloc extended it by 16 MiB during a load:
        before = (now - {(grown.start, grown.end)}) | {(grown.start, grown.start + (8 << 20))}
        regions = huge_pages.collapse_new(before).join(timeout=60).regions
        new_part = (grown.start + (8 << 20), grown.end)
        assert _covered(regions, new_part) >= (16 << 20) - 2 * huge_pages.HUGE_PAGE, regions  # its whole 2 MiB pages
        assert _covered(regions, (grown.start, new_part[0])) == 0, regions
    finally:
        grown.close()


def test_memory_mapped_during_a_load_but_never_touched_is_left_alone():
    before = huge_pages.snapshot()
    untouched, touched = _Mapping(16 << 20, touched=False), _Mapping(16 << 20, touched=True)
    try:
        regions = huge_pages.collapse_new(before).join(timeout=60).regions
        assert _covered(regions, (touched.start, touched.end)) >= (16 << 20) - 2 * huge_pages.HUGE_PAGE, regions
        assert _covered(regions, (untouched.start, untouched.end)) == 0, regions
    finally:
        untouched.close()
        touched.close()
