"""`python -m tori.conformance`: PyTorch's OpInfo database through tori (`make
conformance`). Checks every op (or `--ops`) for each `--dtype` in worker processes,
compares the failures with the committed expected-failures list, writes a summary,
and exits 1 on any unexpected outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXPECTED = ROOT / "tests" / "conformance" / "expected_failures.toml"
HEADER = """\
# OpInfo entries that tori does not compile correctly with fallback="error", by dtype,
# each with its reason, which starts with the kind of failure (compile, mismatch, dynamo,
# dtype, runtime, not-compiled, crash, timeout). `make conformance` (python -m
# tori.conformance) and the test suite fail when an op on this list passes or fails
# another way, or an op off it fails; `--update-expected` rewrites it."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tori.conformance", description=__doc__)
    parser.add_argument("--dtype", nargs="+", default=["float32", "float16"],
                        choices=["float32", "float16", "bfloat16", "float64"])
    parser.add_argument("--ops", nargs="+", help="OpInfo names (name.variant); default: every op with the dtype")
    parser.add_argument("--samples", type=int, default=3, help="samples per op")
    parser.add_argument("--mode", default="tori", choices=["tori", "tori-fallback", "inductor"],
                        help="tori with fallback 'error' (checked against the expected failures), tori with its "
                             "default fallback, or TorchInductor (for comparison)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--timeout", type=float, default=300, help="seconds one op may take")
    parser.add_argument("--expected", type=Path, default=EXPECTED)
    parser.add_argument("--summary", type=Path, help="write the summary tables (markdown) here")
    parser.add_argument("--json", type=Path, help="write every outcome (JSON lines) here")
    parser.add_argument("--update-expected", action="store_true", help="rewrite the expected-failures list")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("TORI_CACHE_DIR", tempfile.mkdtemp(prefix="tori-conformance-cache-"))

    from tori.conformance import expectations
    from tori.conformance.opinfo import DTYPES, ops_for
    from tori.conformance.runner import run_ops, work

    if args.worker is not None:
        work(json.loads(args.worker.read_text()), args.dtype[0], args.samples, args.mode, sys.stdout)
        return 0

    # Only tori with fallback 'error' is held to the expected-failures list.
    expected = expectations.load(args.expected) if args.mode == "tori" and args.expected.exists() else None
    outcomes, surprises = [], []
    start = time.monotonic()
    for dtype in args.dtype:
        ops = args.ops or ops_for(DTYPES[dtype])

        done = [0]

        def report(outcome, total=len(ops), dtype=dtype, done=done):
            done[0] += 1
            surprise = expected is not None and expectations.unexpected(outcome, expected)
            mark = "UNEXPECTED " if surprise else ""
            print(f"[{done[0]}/{total}] {dtype} {outcome.op}: {mark}{outcome.status.value} {outcome.kind.value} "
                  f"({outcome.seconds:.1f} s) {outcome.detail[:160]}", flush=True)

        results = run_ops(ops, dtype, samples=args.samples, mode=args.mode, jobs=args.jobs, timeout_s=args.timeout,
                          on_outcome=report)
        outcomes += results
        if expected is not None:
            surprises += [s for s in (expectations.unexpected(o, expected) for o in results) if s]
    minutes = (time.monotonic() - start) / 60
    table = expectations.summary_table(outcomes)
    print(f"\n{table}\n\n{len(outcomes)} checks in {minutes:.1f} min")
    if args.json:
        args.json.write_text("".join(json.dumps(o.to_json()) + "\n" for o in outcomes))
    if args.summary:
        args.summary.write_text(f"{table}\n\nFailures:\n\n{expectations.failure_table(outcomes)}\n")
    if args.update_expected:
        if args.mode != "tori":
            parser.error("--update-expected needs --mode tori")
        expectations.write(args.expected, outcomes, expected or {}, HEADER)
        print(f"wrote {args.expected}")
        return 0
    if surprises:
        print(f"\n{len(surprises)} unexpected outcomes:\n" + "\n".join(f"  {s}" for s in surprises))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
