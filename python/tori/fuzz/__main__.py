"""`python -m tori.fuzz`: the long fuzzing run (`make fuzz`). For each mode (values,
gradients, dynamic shapes, export: tori.fuzz.modes) and seed, one hypothesis run; a
wrong result or crash is shrunk to a minimal program, printed as a reproducer, and
the next seed goes on. Ends with a summary per mode.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings


def main(argv: list[str] | None = None) -> int:
    from tori.fuzz.modes import Mode

    parser = argparse.ArgumentParser(prog="python -m tori.fuzz", description=__doc__)
    parser.add_argument("--modes", nargs="+", choices=[m.value for m in Mode], default=[m.value for m in Mode])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--batches", type=int, default=100, help="batches per seed and mode")
    parser.add_argument("--batch-size", type=int, default=8, help="programs per compiled batch at most")
    parser.add_argument("--no-shrink", action="store_true",
                        help="report every program as found, none shrunk (the test suite's run)")
    parser.add_argument("--json", type=Path, help="write the summaries and every program not matching here")
    args = parser.parse_args(argv)
    # A compile cache of its own: fuzzed graphs are never worth keeping.
    os.environ.setdefault("TORI_CACHE_DIR", tempfile.mkdtemp(prefix="tori-fuzz-cache-"))

    from tori.fuzz.check import Summary, Verdict, check
    from tori.fuzz.strategies import batches
    from tori.stats import counters

    results, failed = {}, False
    for mode in map(Mode, args.modes):
        summary = Summary()
        variants_before = counters.shape_variants
        shrunk = []
        longest = [0.0]
        for value in args.seeds:
            failing = []
            phases = [Phase.explicit, Phase.reuse, Phase.generate] if args.no_shrink else list(Phase)

            @seed(value)
            @settings(max_examples=args.batches, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck), phases=phases)
            @given(batches(size=args.batch_size, mode=mode.value))
            def run(programs):
                # Once a failure is found, hypothesis shrinks it: those runs are not counted.
                started = time.perf_counter()
                outcomes = check(programs, Summary() if failing else summary, mode)
                longest[0] = max(longest[0], time.perf_counter() - started)
                bad = [o for o in outcomes if o.verdict in (Verdict.WRONG, Verdict.CRASH)]
                if bad and not args.no_shrink:
                    failing.append(bad)
                    raise AssertionError("\n\n".join(
                        f"{o.verdict.value}: {o.detail}\n{o.program.reproducer(mode.value)}" for o in bad))

            try:
                run()
            except AssertionError as error:
                shrunk.append(value)
                print(f"\n=== {mode}, seed {value}: minimal failing program ===\n{error}\n", flush=True)
            print(f"{mode}, seed {value}: {summary.line()}", flush=True)
        if shrunk:
            print(f"\n{mode}: seeds with a failure (shrunk programs above): {shrunk}")
        variants = f"; {counters.shape_variants - variants_before} static-shape variants" if mode is Mode.DYNAMIC else ""
        print(f"\n{mode} summary: {summary.line()}; longest batch {longest[0]:.1f} s{variants}")
        if summary.refusals:
            print("refused, by reason:")
            for reason, count in sorted(summary.refusals.items(), key=lambda item: -item[1]):
                print(f"  {count:5d}  {reason}")
        failed |= bool(shrunk or summary.failures)
        results[mode.value] = {
            "programs": summary.programs, "line": summary.line(), "compiles": summary.compiles,
            "seconds": round(summary.seconds, 1), "longest_batch_s": round(longest[0], 1),
            "shape_variants": counters.shape_variants - variants_before,
            "verdicts": {v.value: n for v, n in summary.verdicts.items()},
            "not_matching": [{"verdict": o.verdict.value, "key": o.program.key(), "detail": o.detail,
                              "reproducer": o.program.reproducer(mode.value)}
                             for o in [*summary.failures, *summary.refused]]}
    if args.json is not None:
        args.json.write_text(json.dumps({"seeds": args.seeds, "batches": args.batches,
                                         "iree_compiles": counters.iree_compiles, "modes": results}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
