"""`tori.compiler.inspect`: the text of each stage for a function and example inputs,
as strings in Python, without building or running an IREE module.

Dynamo captures the function with a backend that stops at IREE's input: each graph
goes through AOTAutograd, the importer and tori's passes, then runs in eager PyTorch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from tori.config import Options
from tori.stages import Stage
from tori.targets import Target

# The stages inspect can return, in pipeline order; `iree` is the module iree-compile
# would be given, after a comment holding its command line.
TEXT_STAGES = (Stage.DYNAMO, Stage.ATEN, Stage.TORCH, Stage.TORI, Stage.IREE)


class Inspection(dict):
    """Stage name -> text of the first graph; `graphs` holds every captured graph's
    stages (more than one after a graph break), `passes` each graph's PassRuns."""

    def __init__(self, graphs: list[dict[str, str]], passes: list[list]):
        super().__init__(graphs[0] if graphs else {})
        self.graphs = graphs
        self.passes = passes


def _stage_set(stages: Iterable[str | Stage] | None) -> tuple[Stage, ...]:
    if stages is None:
        return TEXT_STAGES
    chosen = {Stage.parse(s) if isinstance(s, str) else s for s in ([stages] if isinstance(stages, str) else stages)}
    unknown = chosen - set(TEXT_STAGES)
    if unknown:
        from tori.errors import OptionsError

        raise OptionsError("stage for inspect", sorted(s.value for s in unknown)[0], [s.value for s in TEXT_STAGES],
                           unknown=True)
    return tuple(s for s in TEXT_STAGES if s in chosen)


def inspect(fn: Callable, *example_inputs: Any, stages: Iterable[str | Stage] | None = None,
            target: Target | str | None = None, options: dict[str, Any] | None = None,
            keep_large_constants: bool = False) -> Inspection:
    """The text of `stages` (default: dynamo, aten, torch, tori, iree) for `fn` called on
    `example_inputs`, compiled with tori's options (current config, then `options`, then
    `target`). Large constants are elided unless `keep_large_constants`."""
    from torch_mlir import ir  # noqa: F401  (MLIR loads before Dynamo runs the backend)

    from tori.frontend.backend import _dynamo_constants, _use_constants_as_literals
    from tori.frontend.decompositions import decomposition_table
    from tori.frontend.importer import import_graph
    from tori.passes import run_pipeline
    from tori.passes.lower_dialect import lower_for_iree
    from tori.targets import codegen
    from tori.targets.build import compiled_targets, invocation as build_invocation
    from tori.tools.dump import elided

    merged = dict(options or {})
    if target is not None:
        merged["target"] = target
    opts = Options.from_mapping(merged)
    wanted = _stage_set(stages)
    last = max(TEXT_STAGES.index(s) for s in wanted)
    graphs: list[dict[str, str]] = []
    passes: list[list] = []

    def show(text: str) -> str:
        return elided(text, keep_large_constants)

    def backend(gm: torch.fx.GraphModule, inputs: list[Any]):
        texts: dict[str, str] = {}
        graphs.append(texts)
        passes.append([])
        name = f"inspect{len(graphs) - 1}"
        if Stage.DYNAMO in wanted:
            texts[Stage.DYNAMO.value] = gm.code
        constants = _dynamo_constants(gm)

        def compile_aot(aot_gm: torch.fx.GraphModule, aot_inputs: list[Any]):
            if texts.get("_done"):  # a backward graph: the forward's stages are what is shown
                return make_boxed_func(aot_gm.forward)
            texts["_done"] = "1"
            if constants:
                _use_constants_as_literals(aot_gm, constants)
            if Stage.ATEN in wanted:
                texts[Stage.ATEN.value] = aot_gm.code
            if last >= TEXT_STAGES.index(Stage.TORCH):
                module, _ = import_graph(aot_gm, graph_name=name)
                if Stage.TORCH in wanted:
                    texts[Stage.TORCH.value] = show(str(module))
                if last >= TEXT_STAGES.index(Stage.TORI) and opts.tori_pipeline:
                    passes[-1] = run_pipeline(module, opts.tori_pipeline, graph=name)
                if Stage.TORI in wanted:
                    texts[Stage.TORI.value] = show(str(module))
                if Stage.IREE in wanted:
                    strategy = codegen.choose(aot_gm, opts, compiled_targets(opts))
                    lower_for_iree(module, opts, graph=name, codegen=strategy)
                    command = build_invocation(opts, opts.target, codegen=strategy)
                    texts[Stage.IREE.value] = (f"// {command.shell_command(f'{name}.mlir', f'{name}.vmfb')}\n"
                                               + show(str(module)))
            return make_boxed_func(aot_gm.forward)

        return aot_autograd(fw_compiler=compile_aot, bw_compiler=compile_aot, inference_compiler=compile_aot,
                            decompositions=decomposition_table())(gm, inputs)

    compiled = torch.compile(fn, backend=backend)
    compiled(*example_inputs)
    for texts in graphs:
        texts.pop("_done", None)
    return Inspection(graphs, passes)
