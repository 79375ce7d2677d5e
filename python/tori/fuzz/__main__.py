"""`python -m tori.fuzz`: the long fuzzing run (`make fuzz`). Each seed is one
hypothesis run; a wrong result or crash is shrunk to a minimal program, printed
as a reproducer, and the next seed goes on. Ends with a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tori.fuzz", description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--batches", type=int, default=60, help="batches per seed")
    parser.add_argument("--batch-size", type=int, default=8, help="programs per compiled batch at most")
    parser.add_argument("--no-shrink", action="store_true",
                        help="report every program as found, none shrunk (the test suite's run)")
    parser.add_argument("--json", type=Path, help="write the summary and every program not matching here")
    args = parser.parse_args(argv)
    # A compile cache of its own: fuzzed graphs are never worth keeping.
    os.environ.setdefault("TORI_CACHE_DIR", tempfile.mkdtemp(prefix="tori-fuzz-cache-"))

    from tori.fuzz.check import Summary, Verdict, check
    from tori.fuzz.strategies import batches

    summary = Summary()
    shrunk = []
    for value in args.seeds:
        failing = []

        phases = [Phase.explicit, Phase.reuse, Phase.generate] if args.no_shrink else list(Phase)

        @seed(value)
        @settings(max_examples=args.batches, database=None, deadline=None, suppress_health_check=list(HealthCheck),
                  phases=phases)
        @given(batches(size=args.batch_size))
        def run(programs):
            # Once a failure is found, hypothesis shrinks it: those runs are not counted.
            outcomes = check(programs, Summary() if failing else summary)
            bad = [o for o in outcomes if o.verdict in (Verdict.WRONG, Verdict.CRASH)]
            if bad and not args.no_shrink:
                failing.append(bad)
                raise AssertionError("\n\n".join(f"{o.verdict.value}: {o.detail}\n{o.program.reproducer()}" for o in bad))

        try:
            run()
        except AssertionError as error:
            shrunk.append(value)
            print(f"\n=== seed {value}: minimal failing program ===\n{error}\n", flush=True)
        print(f"seed {value}: {summary.line()}", flush=True)
    if shrunk:
        print(f"\nseeds with a failure (shrunk programs above): {shrunk}")
    print(f"\nsummary: {summary.line()}")
    if summary.refusals:
        print("refused, by reason:")
        for reason, count in sorted(summary.refusals.items(), key=lambda item: -item[1]):
            print(f"  {count:5d}  {reason}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "programs": summary.programs, "line": summary.line(),
            "verdicts": {v.value: n for v, n in summary.verdicts.items()},
            "not_matching": [{"verdict": o.verdict.value, "key": o.program.key(), "detail": o.detail,
                              "reproducer": o.program.reproducer()}
                             for o in [*summary.failures, *summary.refused]]}, indent=1))
    return 1 if shrunk or summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
