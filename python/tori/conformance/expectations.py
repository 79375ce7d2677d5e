"""The committed list of expected failures, keyed by dtype and op name, each with its
reason, which starts with the kind of failure (`compile: ...`, `mismatch: ...`: see
`Kind`), and the verdict on a run: an op off the list that fails, an op on the list
that passes (so that the list only shrinks), and a listed op that fails in another
way than listed (a missing lowering that starts compiling to wrong values, crashing
or timing out) are unexpected.
"""

from __future__ import annotations

import re
import tomllib
from collections import Counter
from pathlib import Path

from tori.conformance.opinfo import Kind, Outcome, Status

Expected = dict[str, dict[str, str]]  # dtype -> op -> reason


def load(path: Path) -> Expected:
    with open(path, "rb") as file:
        data = tomllib.load(file)
    return {dtype: dict(ops) for dtype, ops in data.items()}


_FAILURE_KINDS = {kind.value: kind for kind in Kind if kind not in (Kind.NONE, Kind.EAGER, Kind.NO_SAMPLES)}


def listed_kind(reason: str) -> Kind | None:
    """The kind of failure a listed reason names (its prefix up to ':'), or None."""
    return _FAILURE_KINDS.get(reason.split(":", 1)[0].strip())


def failure_kinds() -> list[str]:
    return sorted(_FAILURE_KINDS)


def unexpected(outcome: Outcome, expected: Expected) -> str | None:
    """Why `outcome` disagrees with the list, or None when it agrees."""
    listed = expected.get(outcome.dtype, {}).get(outcome.op)
    if outcome.status is Status.PASS and listed is not None:
        return f"{outcome.op} ({outcome.dtype}) passes now: remove it from the expected failures (listed: {listed})"
    if outcome.status is Status.FAIL and listed is None:
        return f"{outcome.op} ({outcome.dtype}) fails [{outcome.kind.value}]: {outcome.detail}"
    if outcome.status is Status.FAIL and listed_kind(listed) is not outcome.kind:
        return (f"{outcome.op} ({outcome.dtype}) fails [{outcome.kind.value}], but is listed as failing "
                f"[{listed.split(':', 1)[0]}]: {outcome.detail} (listed: {listed})")
    return None


_NO_LOWERING = re.compile(r"op torch\.(aten\.\w+|prims\.\w+)[\w.]*: failed to legalize operation '(?:torch\.operator|torch\.aten[\w.]*)'")
_LEFTOVER = re.compile(r"failed to legalize operation '(torch\.constant\.\w+)'")


def reason(outcome: Outcome) -> str:
    """A short reason for a failing outcome, starting with its kind."""
    detail = outcome.detail
    match = _NO_LOWERING.search(detail)
    if match:
        return f"{outcome.kind.value}: IREE has no lowering of {match.group(1)}"
    match = _LEFTOVER.search(detail)
    if match:
        return f"{outcome.kind.value}: a {match.group(1)} is left over at IREE (an operand of an op not lowered)"
    return f"{outcome.kind.value}: {' '.join(detail.split())[:200]}"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def write(path: Path, outcomes: list[Outcome], previous: Expected, header: str) -> None:
    """The list made from `outcomes`' failures; the listed reason (perhaps written by
    hand after its kind) is kept for an op that still fails the same way."""
    lines = [header.rstrip(), ""]
    for dtype in sorted({o.dtype for o in outcomes} | set(previous)):
        failing = sorted((o for o in outcomes if o.dtype == dtype and o.status is Status.FAIL), key=lambda o: o.op)
        checked = {o.op for o in outcomes if o.dtype == dtype}
        kept = {op: reason for op, reason in previous.get(dtype, {}).items() if op not in checked}
        entries = {**kept}
        for outcome in failing:
            old = previous.get(dtype, {}).get(outcome.op)
            same_kind = old is not None and listed_kind(old) is outcome.kind
            entries[outcome.op] = old if same_kind else reason(outcome)
        lines.append(f"[{dtype}]")
        lines += [f"{_quote(op)} = {_quote(reason)}" for op, reason in sorted(entries.items())]
        lines.append("")
    path.write_text("\n".join(lines))


def summary_table(outcomes: list[Outcome]) -> str:
    """Markdown: per dtype, ops checked, eager-runnable, passing, and failures by kind."""
    rows = ["| mode | dtype | ops | eager runs | pass | fail | failures by kind |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for mode, dtype in sorted({(o.mode, o.dtype) for o in outcomes}):
        mine = [o for o in outcomes if o.dtype == dtype and o.mode == mode]
        runs = [o for o in mine if o.status is not Status.SKIP]
        passed = sum(o.status is Status.PASS for o in runs)
        kinds = Counter(o.kind.value for o in runs if o.status is Status.FAIL)
        by_kind = ", ".join(f"{kind} {count}" for kind, count in kinds.most_common())
        ran = Counter(o.ran for o in runs if o.status is Status.PASS and o.ran)
        how = f" ({', '.join(f'{count} {way}' for way, count in ran.most_common())})" if ran else ""
        rows.append(f"| {mode} | {dtype} | {len(mine)} | {len(runs)} | {passed}{how} | {len(runs) - passed} | {by_kind} |")
    return "\n".join(rows)


def failure_table(outcomes: list[Outcome]) -> str:
    rows = ["| op | dtype | kind | detail |", "| --- | --- | --- | --- |"]
    for o in sorted(outcomes, key=lambda o: (o.dtype, o.op)):
        if o.status is Status.FAIL:
            detail = o.detail.replace("|", "\\|")[:160]
            rows.append(f"| {o.op} | {o.dtype} | {o.kind.value} | {detail} |")
    return "\n".join(rows)
