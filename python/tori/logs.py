"""tori's logging: every module logs under a `tori.*` logger, and library code only
logs (the `tori` command prints). Nothing is shown below warnings unless asked:
`TORI_LOG=info` (or `debug`) in the environment, `tori -v`, or `configure("info")`.

Each stage of a graph logs under `tori.stage` when it starts and when it ends, with
its time ("graph0_inference: iree-compile (cpu) done in 1.92 s"); the CLI shows the
latest one as progress while a compile takes long.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from typing import Iterator

LEVELS = ("debug", "info", "warning", "error")
stage_log = logging.getLogger("tori.stage")
_handler: logging.Handler | None = None


def configure(level: str | None = None) -> None:
    """Show tori's records at `level` (default: $TORI_LOG) on stderr; nothing when unset."""
    from tori.errors import OptionsError

    chosen = level or os.environ.get("TORI_LOG")
    if not chosen:
        return
    if chosen.lower() not in LEVELS:
        where = "TORI_LOG" if level is None else "log level"
        raise OptionsError(where, chosen, LEVELS, unknown=True)
    global _handler
    logger = logging.getLogger("tori")
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(_handler)
        logger.propagate = False  # shown here once, not again by a handler of the root logger
    logger.setLevel(chosen.upper())


@contextlib.contextmanager
def stage(graph: str, what: str) -> Iterator[None]:
    """Log `what` of `graph` starting, and its time when it ends (or fails)."""
    stage_log.info("%s: %s ...", graph, what)
    start = time.perf_counter()
    ok = False
    try:
        yield
        ok = True
    finally:
        stage_log.info("%s: %s %s in %.2f s", graph, what, "done" if ok else "failed", time.perf_counter() - start)
