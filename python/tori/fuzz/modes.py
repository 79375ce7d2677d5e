"""What a fuzzed program is checked for (`Mode`), as two runs whose results must
agree: the program in eager PyTorch (`reference`) and a batch of programs compiled
by tori (`compiled`). Each mode gives every program a flat list of results:

- values: the outputs of one call (torch.compile, static shapes).
- gradients: the outputs, then the gradient of a fixed random weighting of the
  float outputs (the loss) with respect to each float32 input; forward and backward
  compiled (AOTAutograd), fallback='error'.
- dynamic: `dynamic=True`, compiled once; the outputs of calls at other sizes of
  the leading and of the last dim (1, and sizes that divide no vector width), one
  size called often enough to get a static-shape variant (`specialize_shapes`),
  then the first sizes again. A program that eager refuses at a size keeps its
  first inputs for that call.
- export: `tori.export` of the batch, run by `tori.runtime.load` (IREE's runtime,
  numpy in and out).
"""

from __future__ import annotations

import dataclasses
import enum
import tempfile

import numpy as np
import torch

from tori.fuzz.program import Program, batch_source, build
from tori.testing import count_graphs


class Mode(str, enum.Enum):
    VALUES = "values"
    GRADIENTS = "gradients"
    DYNAMIC = "dynamic"
    EXPORT = "export"

    def __str__(self) -> str:
        return self.value


# Dynamic shapes: the calls after the first, as (axis, size); axis 0 is the leading
# dim of the highest-rank input, -1 the last. SPECIALIZE_AFTER calls at one size give
# it a static-shape variant; the sizes seen fewer times run the dynamic module.
SPECIALIZE_AFTER = 2
DYNAMIC_CALLS = ((0, 7), (0, 7), (0, 7), (-1, 1), (0, 13), (-1, 5), (0, None))


def _wants_grad(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32, torch.float64)


def _weight(out: torch.Tensor, k: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + k)
    return torch.randn(out.shape, generator=generator, dtype=torch.float64).to(out.dtype)


def _loss_terms(outputs, offset: int = 0) -> list[torch.Tensor]:
    return [(out * _weight(out, offset + k)).sum(dtype=torch.float64)
            for k, out in enumerate(outputs)
            if isinstance(out, torch.Tensor) and out.requires_grad and out.dtype.is_floating_point]


def _gradients(loss_terms: list[torch.Tensor], leaves: list[torch.Tensor]) -> list[torch.Tensor]:
    wanted = [t for t in leaves if t.requires_grad]
    if not loss_terms or not wanted:
        return [torch.zeros_like(t) for t in wanted]
    grads = torch.autograd.grad(sum(loss_terms), wanted, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(wanted, grads)]


def _leaves(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_(_wants_grad(t)) for t in inputs]


def _axis_of(program: Program, axis: int) -> int | None:
    """The dim, counted from the right, that `axis` names in the programs' common
    (broadcast) shape; None for a program of 0-d inputs."""
    rank = max(len(spec.shape) for spec in program.inputs)
    if rank == 0:
        return None
    return rank if axis == 0 else 1  # from the right: the leading dim is the rank-th


def resized(program: Program, axis: int, size: int | None) -> list[torch.Tensor] | None:
    """The program's inputs with dim `axis` of the broadcast shape at `size` (None:
    the first inputs), each input where that dim is not a broadcast 1; None where
    nothing changes size."""
    if size is None:
        return [spec.make() for spec in program.inputs]
    from_right = _axis_of(program, axis)
    if from_right is None:
        return None
    specs, changed = [], False
    for spec in program.inputs:
        shape = list(spec.shape)
        if len(shape) >= from_right and shape[-from_right] != 1:
            changed |= shape[-from_right] != size
            shape[-from_right] = size
        specs.append(dataclasses.replace(spec, shape=tuple(shape)))
    return [spec.make() for spec in specs] if changed else None


def call_inputs(program: Program, mode: Mode, valid) -> list[list[torch.Tensor]]:
    """The inputs of each call: one call, or for dynamic shapes the first inputs and
    then each resize eager accepts (`valid(inputs)`), the first inputs where it does not."""
    first = [spec.make() for spec in program.inputs]
    if mode is not Mode.DYNAMIC:
        return [first]
    calls = [first]
    for axis, size in DYNAMIC_CALLS:
        inputs = resized(program, axis, size)
        calls.append(inputs if inputs is not None and valid(inputs) else first)
    return calls


def run_program(fn, inputs: list[torch.Tensor], mode: Mode) -> list[torch.Tensor]:
    """One program's results for one call's inputs, in eager (`fn` the program)."""
    if mode is not Mode.GRADIENTS:
        with torch.no_grad():
            return list(fn(*inputs))
    leaves = _leaves(inputs)
    outputs = list(fn(*leaves))
    grads = _gradients(_loss_terms(outputs), leaves)
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in outputs] + list(grads)


def traced_gradients(fn, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The program's results as GRADIENTS computes them, through AOTAutograd's own
    trace run by eager kernels (`backend="aot_eager"`): the backward formulas a
    compiler gets. Eager's autograd may take another: prod's backward divides the
    product by each element where no element is zero (NaN for [1e20, nan]), its
    traced form multiplies the others (1e20). None where it does not run."""
    torch._dynamo.reset()
    try:
        traced = torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=False)
        return run_program(traced, inputs, mode=Mode.GRADIENTS)
    except Exception:
        return None
    finally:
        torch._dynamo.reset()


def result_names(program: Program, mode: Mode, calls: int = 1) -> list[str]:
    names = program.result_names()
    if mode is Mode.GRADIENTS:
        names = names + [f"grad {name}" for name, spec in zip(program.input_names(), program.inputs)
                         if spec.dtype is torch.float32]
    if calls == 1:
        return names
    return [f"call {c}: {name}" for c in range(calls) for name in names]


def compiled(programs: list[Program], inputs: list[list[list[torch.Tensor]]], mode: Mode):
    """The batch of `programs` compiled once and called with each call's inputs
    (`inputs[program][call]`): per program its flat results (calls in order), or the
    error. A call that did not run compiled is an error."""
    fn = build(batch_source(programs), "batch")
    sizes = [len(p.result_names()) for p in programs]
    calls = len(inputs[0])
    if mode is Mode.EXPORT:
        return _exported(fn, [i[0] for i in inputs], sizes)
    torch._dynamo.reset()
    options = {"fallback": "error"}
    if mode is Mode.DYNAMIC:
        options["specialize_after"] = SPECIALIZE_AFTER
    compiled_fn = torch.compile(fn, backend="tori", fullgraph=True, dynamic=mode is Mode.DYNAMIC, options=options)
    results: list[list[torch.Tensor]] = [[] for _ in programs]
    backward = False  # whether a gradient was computed: then a backward graph ran compiled too
    try:
        with count_graphs() as count:
            for c in range(calls):
                args = [t for per_program in inputs for t in per_program[c]]
                if mode is Mode.GRADIENTS:
                    leaves = _leaves(args)
                    outputs = list(compiled_fn(*leaves))
                    backward |= _split_gradients(programs, inputs, outputs, leaves, sizes, results)
                else:
                    with torch.no_grad():
                        outputs = list(compiled_fn(*args))
                    _split(outputs, sizes, results)
    except Exception as error:
        return None, error
    finally:
        torch._dynamo.reset()
    if count.compiled_graphs < 1 + backward or count.fallback_calls or count.compiled_calls < calls * (1 + backward):
        return None, RuntimeError(f"did not run compiled: {count.delta}")
    return results, None


def _split(outputs, sizes, results) -> None:
    position = 0
    for p, size in enumerate(sizes):
        results[p].extend(outputs[position:position + size])
        position += size


def _split_gradients(programs, inputs, outputs, leaves, sizes, results) -> bool:
    """Each program's outputs, then its gradients: the loss is the sum of every
    program's own (its weights numbered per program), so each program's inputs get
    the gradient of its own loss. Whether a backward ran."""
    terms, position = [], 0
    for size in sizes:
        terms += _loss_terms(outputs[position:position + size])
        position += size
    grads = iter(_gradients(terms, leaves))
    position, leaf = 0, 0
    for p, size in enumerate(sizes):
        results[p].extend(o.detach() if isinstance(o, torch.Tensor) else o for o in outputs[position:position + size])
        position += size
        for t in leaves[leaf:leaf + len(inputs[p][0])]:
            if t.requires_grad:
                results[p].append(next(grads))
        leaf += len(inputs[p][0])
    return bool(terms) and any(t.requires_grad for t in leaves)


def _exported(fn, per_program: list[list[torch.Tensor]], sizes):
    import tori
    import tori.runtime

    args = [t for inputs in per_program for t in inputs]
    try:
        with tempfile.TemporaryDirectory(prefix="tori-fuzz-export-") as folder:
            path = tori.export(fn, tuple(args), output_dir=f"{folder}/batch", examples=False,
                               options={"fallback": "error"})
            artifact = tori.runtime.load(path)
            outputs = artifact(*(t.numpy() for t in args))
    except Exception as error:
        return None, error
    outputs = [outputs] if sum(sizes) == 1 else list(outputs)
    results: list[list[torch.Tensor]] = [[] for _ in sizes]
    _split([torch.from_numpy(np.asarray(o)) for o in outputs], sizes, results)
    return results, None
