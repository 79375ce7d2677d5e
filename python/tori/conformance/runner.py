"""Run many OpInfo entries in worker processes, so that a crash or a hang costs one op,
not the run: each worker writes one JSON line when it starts an op and one with the
op's outcome; the parent restarts a dead or stuck worker on the ops it had left.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from tori.conformance.opinfo import Kind, Outcome, Status, check_op


def work(ops: Iterable[str], dtype: str, samples: int, mode: str, out) -> None:
    """The worker's loop: check each op, one JSON line before and one after."""
    for name in ops:
        out.write(json.dumps({"start": name}) + "\n")
        out.flush()
        out.write(json.dumps(check_op(name, dtype, samples=samples, mode=mode).to_json()) + "\n")
        out.flush()


def _kill_group(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _worker(ops: list[str], dtype: str, samples: int, mode: str, timeout_s: float,
            on_outcome: Callable[[Outcome], None]) -> None:
    """Run `ops` in child processes until each has an outcome."""
    pending = list(ops)
    while pending:
        with tempfile.TemporaryDirectory(prefix="tori-conformance-") as scratch:
            listing = Path(scratch, "ops.json")
            listing.write_text(json.dumps(pending))
            command = [sys.executable, "-m", "tori.conformance", "--worker", str(listing), "--dtype", dtype,
                       "--samples", str(samples), "--mode", mode]
            # A session of its own: a stuck worker is killed with its iree-compile children.
            child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "PYTHONWARNINGS": "ignore"}, start_new_session=True)
            kill = functools.partial(_kill_group, child)
            current, started = None, time.monotonic()
            watchdog = threading.Timer(timeout_s, kill)
            watchdog.start()
            try:
                for line in child.stdout:
                    if not line.startswith("{"):
                        continue
                    data = json.loads(line)
                    if "start" in data:
                        current, started = data["start"], time.monotonic()
                        watchdog.cancel()
                        watchdog = threading.Timer(timeout_s, kill)
                        watchdog.start()
                        continue
                    outcome = Outcome.from_json(data)
                    pending.remove(outcome.op)
                    current = None
                    on_outcome(outcome)
            finally:
                watchdog.cancel()
            code = child.wait()
        if current is not None:
            elapsed = time.monotonic() - started
            kind = Kind.TIMEOUT if elapsed >= timeout_s - 1 else Kind.CRASH
            detail = (f"no result within {timeout_s:g} s" if kind is Kind.TIMEOUT
                      else f"the process running it died (exit status {code})")
            pending.remove(current)
            on_outcome(Outcome(current, dtype, Status.FAIL, kind, detail, 0, round(elapsed, 3), mode))
        elif pending and code != 0:
            for name in pending:
                on_outcome(Outcome(name, dtype, Status.FAIL, Kind.CRASH, f"worker exited with status {code}", mode=mode))
            return


def run_ops(ops: list[str], dtype: str, *, samples: int = 3, mode: str = "tori", jobs: int = 1,
            timeout_s: float = 300, on_outcome: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Outcomes of `ops` for `dtype` checked as `mode` says, by `jobs` worker processes."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def collect(outcome: Outcome) -> None:
        with lock:
            outcomes.append(outcome)
            if on_outcome is not None:
                on_outcome(outcome)

    shares = [ops[index::jobs] for index in range(jobs)]
    threads = [threading.Thread(target=_worker, args=(share, dtype, samples, mode, timeout_s, collect)) for share in shares if share]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    order = {name: index for index, name in enumerate(ops)}
    return sorted(outcomes, key=lambda outcome: order[outcome.op])
