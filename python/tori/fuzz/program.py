"""A fuzzed program: inputs and a small DAG of PyTorch expressions, printable as
readable Python source (the reproducer) and built from that very source.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

DTYPE_NAMES = {
    torch.float32: "torch.float32",
    torch.float16: "torch.float16",
    torch.int64: "torch.int64",
    torch.bool: "torch.bool",
}


@dataclass(frozen=True)
class InputSpec:
    """One input tensor: its shape, dtype, and how its values are made (seeded random
    values at `scale`, then `specials` written at seeded positions)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int = 0
    scale: float = 1.0
    specials: tuple = ()

    def make(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        numel = math.prod(self.shape)
        if self.dtype is torch.bool:
            flat = torch.rand(numel, generator=generator) > 0.5
        elif self.dtype.is_floating_point:
            flat = (torch.randn(numel, generator=generator, dtype=torch.float64) * self.scale).to(self.dtype)
        else:
            flat = torch.randint(-20, 21, (numel,), generator=generator, dtype=self.dtype)
        if numel:
            positions = torch.randperm(numel, generator=generator)
            for position, value in zip(positions.tolist(), self.specials):
                flat[position] = value
        return flat.reshape(self.shape)


@dataclass(frozen=True)
class Node:
    """`name = expression`, where the expression reads earlier names."""

    name: str
    op: str
    expression: str


@dataclass(frozen=True)
class Program:
    inputs: tuple[InputSpec, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...] = field(default=())

    def input_names(self, prefix: str = "") -> list[str]:
        return [f"{prefix}x{i}" for i in range(len(self.inputs))]

    def body(self, prefix: str = "") -> list[str]:
        """The statements, every name given `prefix` (to batch several programs)."""
        lines = []
        for node in self.nodes:
            lines.append(f"{prefix}{node.name} = {_prefixed(node.expression, prefix)}")
        return lines

    def result_names(self, prefix: str = "") -> list[str]:
        return [f"{prefix}{name}" for name in (self.outputs or [n.name for n in self.nodes])]

    def function_source(self, name: str = "program") -> str:
        lines = [f"def {name}({', '.join(self.input_names())}):"]
        lines += [f"    {line}" for line in self.body()]
        lines.append(f"    return ({', '.join(self.result_names())},)")
        return "\n".join(lines) + "\n"

    def key(self) -> str:
        """A short, stable name of the program: a digest of its source and its inputs."""
        return hashlib.sha256(self.reproducer().encode()).hexdigest()[:12]

    def reproducer(self, mode: str = "values") -> str:
        """A self-contained script that runs the program in eager and with tori, as
        `mode` (tori.fuzz.modes.Mode) checks it."""
        inputs = "\n".join(f"{name} = {tensor_literal(spec.make())}"
                           for name, spec in zip(self.input_names(), self.inputs))
        args = ", ".join(self.input_names())
        head = ("import torch\nimport torch.nn.functional as F\n"
                "nan, inf = float('nan'), float('inf')\n\n"
                f"{self.function_source()}\n{inputs}\n")
        compiled = (f"torch.compile(program, backend='tori', fullgraph=True, dynamic={mode == 'dynamic'},\n"
                    f"                         options={{'fallback': 'error'}})")
        check = ("for a, e in zip(actual, expected):\n"
                 "    torch.testing.assert_close(a, e, equal_nan=True)\n")
        if mode == "gradients":
            return head + (
                f"def results(fn, *inputs):\n"
                f"    leaves = [t.detach().clone().requires_grad_(t.dtype == torch.float32) for t in inputs]\n"
                f"    outputs = fn(*leaves)\n"
                f"    loss = sum((o * torch.randn(o.shape, generator=torch.Generator().manual_seed(1000 + k),\n"
                f"                                dtype=torch.float64).to(o.dtype)).sum(dtype=torch.float64)\n"
                f"               for k, o in enumerate(outputs) if o.requires_grad and o.dtype.is_floating_point)\n"
                f"    wanted = [t for t in leaves if t.requires_grad]\n"
                f"    grads = torch.autograd.grad(loss, wanted, allow_unused=True) if wanted and loss else ()\n"
                f"    return [o.detach() for o in outputs] + [g for g in grads if g is not None]\n\n"
                f"expected = results(program, {args})\n"
                f"actual = results({compiled}, {args})\n" + check)
        if mode == "export":
            return head + (
                "import tempfile, tori, tori.runtime\n"
                f"expected = program({args})\n"
                f"path = tori.export(program, ({args},), output_dir=tempfile.mkdtemp() + '/program', examples=False)\n"
                f"actual = tori.runtime.load(path)(*(t.numpy() for t in ({args},)))\n"
                "actual = [torch.from_numpy(a) for a in (actual if isinstance(actual, tuple) else (actual,))]\n"
                + check)
        return head + (f"expected = program({args})\nactual = {compiled}({args})\n"
                       + ("# then the calls at other sizes of the leading and last dims (tori.fuzz.modes)\n"
                          if mode == "dynamic" else "") + check)


_NAME = re.compile(r"\b([xv]\d+)\b")


def _prefixed(expression: str, prefix: str) -> str:
    """Values are named x<i> (inputs) and v<i> (nodes): give each name `prefix`."""
    return _NAME.sub(lambda m: prefix + m.group(1), expression) if prefix else expression


def tensor_literal(tensor: torch.Tensor) -> str:
    values = repr(tensor.tolist())
    literal = f"torch.tensor({values}, dtype={DTYPE_NAMES[tensor.dtype]})"
    if tensor.numel() == 0 or tensor.dim() == 0:
        return f"{literal}.reshape({tuple(tensor.shape)!r})"
    return literal


def namespace() -> dict:
    """What a program's source may name."""
    return {"torch": torch, "F": F, "nan": float("nan"), "inf": float("inf")}


def build(source: str, name: str):
    scope = namespace()
    code = compile(source, f"<tori-fuzz {name}>", "exec")
    exec(code, scope)
    return scope[name]


def batch_source(programs: list[Program], name: str = "batch") -> str:
    """One function computing several independent programs: one compile checks all."""
    params = [n for i, p in enumerate(programs) for n in p.input_names(f"p{i}_")]
    lines = [f"def {name}({', '.join(params)}):"]
    results = []
    for i, program in enumerate(programs):
        lines += [f"    {line}" for line in program.body(f"p{i}_")]
        results += program.result_names(f"p{i}_")
    lines.append(f"    return ({', '.join(results)},)")
    return "\n".join(lines) + "\n"
