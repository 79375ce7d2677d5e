"""Resident weights in 2 MiB pages (Linux's transparent huge pages).

A module with resident weights (frontend/resident.py) packs them at load, in its
initializer, into memory IREE allocates with malloc: 4 KiB pages where the system's
transparent huge pages are `madvise` (Debian's default). A call that streams every
weight, as a decoding step does, then walks a page table for each 4 KiB it reads. Once
a module has loaded, the anonymous mappings that appeared while it loaded are collapsed
into 2 MiB pages (`madvise(MADV_COLLAPSE)`, Linux 6.1), in a thread of its own so that
the first call does not wait for it (the driver trials of every graph wait while any
collapse runs: compiled_graph.py). On by default (the `huge_pages` option). Llama's
static-cache decoding step (113 MB of weights a token, AMD EPYC, `generate()` alone in
its process): IREE's invocation 4.46-4.47 -> 3.81-3.88 ms a call; collapsing a load's
168-216 MiB (the modules of both CPU drivers) took 420-670 ms.

Only read-write anonymous memory mapped while the module loaded: mappings that were not
there before, and the part by which one that was has grown (the heap's end moves as
malloc extends it; the whole heap, taken for new because its end had moved, was once
collapsed at every load: 125 MiB of Python's and the compiler's memory in 0.9 s for
a graph with 0.4 MB of weights, and a fast graph's driver trials waited out the
collapse). Of that, the 2 MiB pages at least RESIDENT_FRACTION in memory (`mincore`; a
collapse fills a range's holes: an unused reservation would grow the process), in runs
of MIN_BYTES or more. IREE's packed weights can lie in one mapping with memory it never
touched (a 64 MiB weight's two packed copies and 64 MiB untouched between them, in one
192 MiB mapping): a test of the whole mapping's residency left them in 4 KiB pages.
The memory's contents never change; where the kernel refuses (another OS, an older
kernel, huge pages disabled) nothing happens. Memory that malloc hands IREE from
mappings the process had before the load stays in the pages it has.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import mmap
import sys
import threading
import time
from dataclasses import dataclass, field

MIN_BYTES = 4 << 20
RESIDENT_FRACTION = 0.9
HUGE_PAGE = 2 << 20
_PAGE = mmap.PAGESIZE
# Tries per range: the kernel refuses a collapse with EAGAIN where it could not get a
# huge page at that moment (memory too fragmented for compaction to free one in time).
COLLAPSE_ATTEMPTS = 3
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25

Region = tuple[int, int]  # [start, end) addresses
log = logging.getLogger("tori.runtime")


def _regions(smallest: int = MIN_BYTES) -> frozenset[Region]:
    """The process's read-write anonymous mappings of `smallest` bytes or more
    (/proc/self/maps); empty where there is no such file."""
    found = set()
    try:
        with open("/proc/self/maps") as mappings:
            for line in mappings:
                head = line.split()
                if len(head) < 5 or "-" not in head[0]:
                    continue
                start, end = (int(x, 16) for x in head[0].split("-"))
                anonymous = len(head) == 5 or head[5] == "[heap]"
                if anonymous and head[1].startswith("rw") and end - start >= smallest:
                    found.add((start, end))
    except OSError:
        return frozenset()
    return frozenset(found)


def _new_parts(region: Region, before: frozenset[Region]) -> list[Region]:
    """The parts of `region` that no mapping of `before` covered."""
    parts = [region]
    for old_start, old_end in before:
        parts = [part for start, end in parts for part in ((start, min(end, old_start)), (max(start, old_end), end))
                 if part[0] < part[1]]
    return parts


def _resident_ranges(region: Region) -> list[Region]:
    """The 2 MiB-aligned ranges of `region` whose huge pages are each at least
    RESIDENT_FRACTION in memory (`mincore`), adjacent ones joined: IREE's packed weights
    can share one mapping with memory it reserved and never touched."""
    first = -(-region[0] // HUGE_PAGE) * HUGE_PAGE
    last = region[1] // HUGE_PAGE * HUGE_PAGE
    count = (last - first) // _PAGE
    if count <= 0:
        return []
    present = (ctypes.c_ubyte * count)()
    if _libc().mincore(first, last - first, present) != 0:
        return []
    flags, per_huge_page = bytes(present), HUGE_PAGE // _PAGE
    ranges: list[Region] = []
    for index in range(0, count, per_huge_page):
        if per_huge_page - flags[index:index + per_huge_page].count(0) < RESIDENT_FRACTION * per_huge_page:
            continue
        low = first + index * _PAGE
        if ranges and ranges[-1][1] == low:
            ranges[-1] = (ranges[-1][0], low + HUGE_PAGE)
        else:
            ranges.append((low, low + HUGE_PAGE))
    return ranges


@functools.lru_cache(maxsize=None)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def snapshot() -> frozenset[Region]:
    """The mappings before a load: `collapse_new` leaves them alone."""
    return _regions(smallest=0) if sys.platform == "linux" else frozenset()


@dataclass
class Collapse:
    """A collapse running in its thread; `collapsed` the bytes now in huge pages."""

    regions: list[Region]
    collapsed: int = 0
    refusals: list[int] = field(default_factory=list)  # errno of each madvise the kernel refused
    _thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> "Collapse":
        if self._thread is not None:
            self._thread.join(timeout)
        return self

    def _run(self) -> None:
        began = time.perf_counter()
        libc = _libc()
        for start, end in self.regions:
            first = -(-start // HUGE_PAGE) * HUGE_PAGE
            last = end // HUGE_PAGE * HUGE_PAGE
            if last <= first:
                continue
            libc.madvise(first, last - first, _MADV_HUGEPAGE)
            for _ in range(COLLAPSE_ATTEMPTS):
                if libc.madvise(first, last - first, _MADV_COLLAPSE) == 0:
                    self.collapsed += last - first
                    break
                self.refusals.append(ctypes.get_errno())
                if self.refusals[-1] != errno.EAGAIN:  # anything but a transient refusal is final
                    break
                time.sleep(0.01)
        total = sum(end - begin for begin, end in self.regions)
        refused = f"; refused: {', '.join(sorted({errno.errorcode.get(e, str(e)) for e in self.refusals}))}" \
            if self.refusals else ""
        log.info("collapsed %d of %d MiB of packed weights into 2 MiB pages in %.0f ms%s", self.collapsed >> 20,
                 total >> 20, (time.perf_counter() - began) * 1e3, refused)


_started: list[Collapse] = []  # the collapses begun in this process, until they end (`collapsing`)
_started_lock = threading.Lock()
_begun = 0  # the collapses begun in this process, ever (`collapses_begun`)


def collapse_new(before: frozenset[Region]) -> Collapse:
    """Collapse, in a thread, the memory mapped since `before` (see the module)."""
    global _begun
    if sys.platform != "linux":
        return Collapse([])
    regions = [resident for region in _regions() if region not in before for part in _new_parts(region, before)
               for resident in _resident_ranges(part) if resident[1] - resident[0] >= MIN_BYTES]
    work = Collapse(regions)
    if regions:
        work._thread = threading.Thread(target=work._run, name="tori-huge-pages", daemon=True)
        work._thread.start()
        with _started_lock:
            _started.append(work)
            _begun += 1
    return work


def collapses_begun() -> int:
    """How many collapses this process has begun: a count that moved, or `collapsing`,
    tells that one ran during a span of time."""
    return _begun


def collapsing() -> bool:
    """Whether any collapse of this process is still running."""
    if not _started:
        return False
    with _started_lock:
        _started[:] = [work for work in _started if work.running]
        return bool(_started)
