"""The graph copies made on the way to Torch-MLIR's importer (frontend/import_copies.py)
generate no Python code: the importer reads their graphs, and code is generated only
for the ATen stage's record."""

import copy

import torch
from torch import nn

import tori.frontend.backend as backend
from tori.frontend.import_copies import import_copy
from tori.testing import assert_matches_eager


class _Lookup(nn.Module):
    """An embedding (an index check taken out of the module) and a linear layer (resident weights)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.proj = nn.Linear(16, 8)

    def forward(self, ids):
        return self.proj(self.embed(ids)).relu()


def test_an_import_copy_generates_its_code_only_when_read_or_called():
    gm = torch.fx.symbolic_trace(lambda x: x * 2 + 1)
    made = import_copy(gm, copy.deepcopy(gm.graph))
    assert type(made)._needs_recompile()
    assert torch.equal(made(torch.ones(3)), torch.full((3,), 3.0))
    assert "mul" in made.code and not type(made)._needs_recompile()


def test_compiling_a_graph_generates_python_only_for_the_aten_stage(monkeypatch):
    generated = []
    counting = [False]
    python_code = torch.fx.Graph.python_code

    def counted(graph, *args, **kwargs):
        if counting[0]:
            generated.append(graph)
        return python_code(graph, *args, **kwargs)

    compile_graph = backend.compile_graph

    def compiling(*args, **kwargs):
        counting[0] = True
        try:
            return compile_graph(*args, **kwargs)
        finally:
            counting[0] = False

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    monkeypatch.setattr(backend, "compile_graph", compiling)
    model = _Lookup().eval()
    with torch.no_grad():
        assert_matches_eager(model, torch.randint(0, 64, (2, 5)), options={"cache": False})
    assert len(generated) == 1, f"{len(generated)} graphs' Python generated while compiling one"
