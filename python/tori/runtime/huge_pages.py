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

Only read-write anonymous mappings that were not there before the load, of MIN_BYTES or
more and at least RESIDENT_FRACTION resident (a collapse fills a range's holes: an
unused reservation would grow the process), and within them whole 2 MiB pages. The
memory's contents never change; where the kernel refuses (another OS, an older kernel,
huge pages disabled) nothing happens. Memory that malloc hands IREE from mappings
the process had before the load stays in the pages it has.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import sys
import threading
import time
from dataclasses import dataclass, field

MIN_BYTES = 4 << 20
RESIDENT_FRACTION = 0.9
HUGE_PAGE = 2 << 20
# Tries per range: the kernel refuses a collapse with EAGAIN where it could not get a
# huge page at that moment (memory too fragmented for compaction to free one in time).
COLLAPSE_ATTEMPTS = 3
_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25

Region = tuple[int, int]  # [start, end) addresses
log = logging.getLogger("tori.runtime")


def _regions(resident: bool = True) -> dict[Region, int]:
    """The process's read-write anonymous mappings of MIN_BYTES or more, with their
    resident bytes (/proc/self/smaps; without `resident`, 0 from /proc/self/maps, which
    the kernel writes in a tenth of the time: a process with torch and a compiled model
    maps thousands of ranges); empty where there is no such file."""
    found: dict[Region, int] = {}
    try:
        with open("/proc/self/smaps" if resident else "/proc/self/maps") as mappings:
            region = None
            for line in mappings:
                head = line.split()
                if len(head) >= 5 and "-" in head[0]:  # a mapping's first line
                    start, end = (int(x, 16) for x in head[0].split("-"))
                    anonymous = len(head) == 5 or head[5] == "[heap]"
                    region = (start, end) if anonymous and head[1].startswith("rw") and end - start >= MIN_BYTES \
                        else None
                    if region is not None and not resident:
                        found[region] = 0
                elif region is not None and head and head[0] == "Rss:":
                    found[region] = int(head[1]) * 1024
                    region = None
    except OSError:
        return {}
    return found


def snapshot() -> frozenset[Region]:
    """The mappings before a load: `collapse_new` leaves them alone."""
    return frozenset(_regions(resident=False)) if sys.platform == "linux" else frozenset()


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
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
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


def collapse_new(before: frozenset[Region]) -> Collapse:
    """Collapse, in a thread, the mappings that appeared since `before` (see the module)."""
    if sys.platform != "linux":
        return Collapse([])
    regions = [r for r, rss in _regions().items() if r not in before and rss >= RESIDENT_FRACTION * (r[1] - r[0])]
    work = Collapse(regions)
    if regions:
        work._thread = threading.Thread(target=work._run, name="tori-huge-pages", daemon=True)
        work._thread.start()
        with _started_lock:
            _started.append(work)
    return work


def collapsing() -> bool:
    """Whether any collapse of this process is still running."""
    if not _started:
        return False
    with _started_lock:
        _started[:] = [work for work in _started if work.running]
        return bool(_started)
