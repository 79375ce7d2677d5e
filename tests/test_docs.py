"""The documentation's examples, run: every fenced block in README.md and docs/*.md
marked `<!-- docs-check: run -->` runs in a temporary folder (shell blocks in bash,
Python blocks in a subprocess), and where a shell block shows output (lines not
starting with `$ `), that output must appear, in order. Numbers may differ (timings,
sizes, values) and `...` stands for anything, so the docs cannot drift from what
tori prints and does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- docs-check: run -->"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass(frozen=True)
class Example:
    file: Path
    line: int  # of the opening fence
    language: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        for index, line in enumerate(lines):
            if line.strip() != MARK:
                continue
            fence = lines[index + 1] if index + 1 < len(lines) else ""
            assert fence.startswith("```"), f"{path}:{index + 1}: {MARK} must be followed by a fenced block"
            end = next(k for k in range(index + 2, len(lines)) if lines[k].startswith("```"))
            found.append(Example(path, index + 2, fence[3:].strip(), "\n".join(lines[index + 2:end])))
    return found


def _script(example: Example) -> tuple[str, list[str]]:
    """A bash script of the block's commands, and the output lines it shows."""
    lines = example.text.splitlines()
    if not any(line.startswith("$ ") for line in lines):
        return example.text, []
    commands, shown, continued = [], [], False
    for line in lines:
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.rstrip().endswith("\\")
        elif line.strip():
            shown.append(line)
    return "\n".join(commands), shown


def _pattern(shown: str) -> re.Pattern:
    """A shown line as a pattern: its numbers any number, `...` anything, spaces any spaces."""
    parts = []
    for piece in re.split(r"(\.\.\.|\d+(?:\.\d+)?(?:e[-+]?\d+)?|\s+)", shown.strip()):
        if piece == "...":
            parts.append(".*")
        elif _NUMBER.fullmatch(piece or "x"):
            parts.append(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
        elif piece.isspace():
            parts.append(r"\s+")
        elif piece:
            parts.append(re.escape(piece))
    return re.compile("".join(parts))


def _missing(shown: list[str], output: str) -> list[str]:
    """The shown lines that do not appear in `output` in order."""
    actual = [line.strip() for line in output.splitlines()]
    position, missing = 0, []
    for line in shown:
        pattern = _pattern(line)
        hit = next((k for k in range(position, len(actual)) if pattern.fullmatch(actual[k])), None)
        if hit is None:
            missing.append(line)
        else:
            position = hit + 1
    return missing


def _workspace(tmp_path: Path) -> dict[str, str]:
    for name in ("benchmarks", "tests"):
        (tmp_path / name).symlink_to(ROOT / name)
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONWARNINGS": "ignore"}


EXAMPLES = examples()


def test_the_docs_have_examples_that_run():
    files = {example.file.name for example in EXAMPLES}
    assert {"README.md", "export.md", "inspect.md"} <= files
    assert all(example.language in ("", "sh", "bash", "python") for example in EXAMPLES)


def test_a_shown_line_matches_other_numbers_but_not_other_words():
    assert _missing(["wrote out/x (1251 KiB)", "  cpu.vmfb  ..."], "wrote out/x (98 KiB)\n  cpu.vmfb  4096 bytes\n") == []
    assert _missing(["max error 1.2e-08"], "max error 3.5e-07") == []
    assert _missing(["output vs eager: matches"], "output vs eager: DIFFERS") == ["output vs eager: matches"]
    assert _missing(["b", "a"], "a\nb\n") == ["a"]  # in order


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs_as_documented(example, tmp_path):
    env = _workspace(tmp_path)
    if example.language == "python":
        done = subprocess.run([sys.executable, "-c", example.text], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
        shown = []
    else:
        script, shown = _script(example)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{example.id} failed (exit {done.returncode}):\n{output[-4000:]}"
    assert "Traceback" not in output, output[-4000:]
    missing = _missing(shown, output)
    assert not missing, f"{example.id}: shown but not printed: {missing}\n--- printed:\n{output[-4000:]}"


def test_the_readme_lists_every_option_with_its_default_and_variable():
    from tori.config import DEFAULT_PIPELINE, ENVIRONMENT, GPU_PIPELINE, Options

    readme = (ROOT / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", readme, flags=re.M))
    assert set(rows) == set(Options.names()), set(rows) ^ set(Options.names())
    assert f'`"{DEFAULT_PIPELINE}"`' in rows["pipeline"]
    assert f'`{GPU_PIPELINE.removeprefix(DEFAULT_PIPELINE + ", ")}`' in rows["pipeline"]
    for name in ("fallback", "cpu", "target", "codegen", "driver"):
        default = getattr(Options(), name)
        assert f'"{getattr(default, "value", default)}"' in rows[name], name
    missing = [variable for variable in ENVIRONMENT if f"`{variable}`" not in readme]
    assert not missing, f"README.md does not name {missing}"
