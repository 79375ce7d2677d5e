"""A module's CPU executables merged into a few groups before their code generation.

iree-compile links every llvm-cpu executable of a module into one before serializing it,
and LLVM's code generation of that one linked executable runs on one thread: on two
cores about a third of a CNN's compile (docs/performance.md, "CPU executables compiled
in groups"). Unlinked, each executable is an LLVM module of its own and pays LLVM's and the
linker's fixed costs (RegNetY's 354 took 40 s against 18). tori merges the executables,
between the configuration phase and code generation (targets/iree_compile.py's PHASES),
into as many groups as the compile has cores, and code generation runs with IREE's
linking off: each group is translated and serialized on its own, the groups in parallel.

Merging is what IREE's linker does, done earlier: each group is one `hal.executable`
with one variant holding every member's exports (ordinals renumbered) and functions,
and every reference `@member::@variant::@export` in the host program names the group
instead. The module is read as IREE prints it (text, with its locations); anything
this does not recognize (several variants, objects, conditions, a symbol defined in
two members) is an error that names it, and tori then compiles the module linked as
IREE does (targets/build.py).

Run as a program in iree-compile's pipe: `python executable_groups.py GROUPS` reads the
module on stdin and writes it on stdout. It imports nothing beyond the standard library.
"""

from __future__ import annotations

import re
import sys

_SYMBOL = r'(?:"[^"\n]*"|[A-Za-z_][\w$.\-]*)'
_EXECUTABLE = re.compile(r"^  hal\.executable (?:private |public )?@(" + _SYMBOL + r") \{$")
_VARIANT = "    hal.executable.variant "
_EXPORT = "      hal.executable.export "
_INNER_MODULE = "      builtin.module {"
_DEFINED = re.compile(r"^(?:        [\w.]+ (?:private |public |nested )?|      hal\.executable\.export (?:public |private )?)@("
                      + _SYMBOL + ")")
_REFERENCE = re.compile(r"@(" + _SYMBOL + r")::@")
_ORDINAL = re.compile(r" ordinal\(\d+\)")


def _closes(line: str, indent: int) -> bool:
    """Whether `line` closes a region opened at `indent` (its location, if printed, after it)."""
    return line.startswith(" " * indent + "}") and line[indent + 1:indent + 2] in ("", " ")


class GroupingError(ValueError):
    """The module is not in the form this merges; its executables stay as they are."""


class _Executable:
    def __init__(self, lines: list[str]):
        self.name = _EXECUTABLE.match(lines[0]).group(1)
        variants = sum(line.startswith(_VARIANT) for line in lines)
        if variants != 1:
            raise GroupingError(f"executable @{self.name} has {variants} variants (targets); groups take one")
        if not lines[1].startswith(_VARIANT) or not lines[1].endswith("{"):
            raise GroupingError(f"executable @{self.name}: expected one hal.executable.variant, found {lines[1][:80]!r}")
        if " objects(" in lines[1]:
            raise GroupingError(f"executable @{self.name}: its variant links objects")
        if not all(_closes(line, indent) for line, indent in zip(lines[-3:], (6, 4, 2))) or _INNER_MODULE not in lines:
            raise GroupingError(f"executable @{self.name}: not one variant holding one module")
        inner = lines.index(_INNER_MODULE)
        self.variant = lines[1]
        self.exports = lines[2:inner]
        self.body = lines[inner + 1:-3]
        for line in self.exports:
            if line.startswith("      ") and not line.startswith("       ") and not line.startswith(_EXPORT) \
                    and not _closes(line, 6):
                raise GroupingError(f"executable @{self.name}: its variant holds {line.strip()[:80]!r}")
        outside = next((line for line in self.body if line and not line.startswith("        ")), None)
        if outside is not None:
            raise GroupingError(f"executable @{self.name}: holds {outside.strip()[:80]!r} beside its module")
        self.defined = [m.group(1) for m in map(_DEFINED.match, self.exports + self.body) if m]


def _blocks(lines: list[str]) -> list[tuple[int, int]]:
    """The line ranges (first, last) of the module's top-level executables."""
    found, index = [], 0
    while index < len(lines):
        if _EXECUTABLE.match(lines[index]):
            end = next(n for n in range(index + 1, len(lines)) if _closes(lines[n], 2))
            found.append((index, end))
            index = end
        index += 1
    return found


def group_executables(text: str, groups: int) -> str:
    """The module `text` with its executables merged into `groups` (round robin)."""
    lines = text.split("\n")
    blocks = _blocks(lines)
    executables = [_Executable(lines[first:last + 1]) for first, last in blocks]
    groups = min(groups, len(executables))
    if groups <= 1 or len(executables) <= groups:
        return text
    if len({e.variant for e in executables}) != 1:
        raise GroupingError("the executables have variants for different targets")
    merged, renamed = [], {}
    for members in (executables[g::groups] for g in range(groups)):
        head, seen, ordinal = members[0], set(), 0
        exports, body = [], []
        for member in members:
            clash = seen.intersection(member.defined)
            if clash:
                raise GroupingError(f"symbol @{sorted(clash)[0]} is defined in more than one executable")
            seen.update(member.defined)
            renamed[member.name] = head.name
            for line in member.exports:
                if line.startswith(_EXPORT):
                    line, count = _ORDINAL.subn(f" ordinal({ordinal})", line, count=1)
                    if count != 1:
                        raise GroupingError(f"executable @{member.name}: an export without an ordinal")
                    ordinal += 1
                exports.append(line)
            body.extend(member.body)
        merged.extend([f"  hal.executable private @{head.name} {{", head.variant, *exports, _INNER_MODULE, *body,
                       "      }", "    }", "  }"])
    inside = {n for first, last in blocks for n in range(first, last + 1)}
    refer = lambda m: f"@{renamed.get(m.group(1), m.group(1))}::@"  # noqa: E731
    host = [_REFERENCE.sub(refer, line) for n, line in enumerate(lines) if n not in inside]
    first = blocks[0][0]  # the groups stand where the first executable stood
    return "\n".join(host[:first] + merged + host[first:])


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: executable_groups.py GROUPS < module.mlir > grouped.mlir", file=sys.stderr)
        return 2
    text = sys.stdin.read()
    try:
        grouped = group_executables(text, int(argv[0]))
    except GroupingError as error:
        print(f"error: executable groups: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(grouped)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
