"""Resident weights in 2 MiB pages (runtime/huge_pages.py): after a module loads, the
memory IREE packed its weights into is collapsed into transparent huge pages, and the
calls after it still match eager."""

from pathlib import Path

import pytest
import torch
from torch import nn

import tori
from tori.config import Options
from tori.errors import OptionsError
from tori.runtime import huge_pages
from tori.testing import count_graphs

_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _anon_huge_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def _model():
    # 2 x 32 MiB of weights, packed at load by IREE's data tiling into memory that malloc
    # maps afresh (its pool serves chunks under 32 MiB from memory it may already hold).
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048)).eval()


@pytest.mark.skipif(not _THP.exists() or "[never]" in _THP.read_text(),
                    reason="this kernel has no transparent huge pages to collapse into")
def test_packed_weights_are_collapsed_into_huge_pages_and_still_match_eager():
    model, x = _model(), torch.randn(2, 2048)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "cache": False,
                                                             "huge_pages": True})
    with torch.no_grad(), count_graphs() as count:
        before = _anon_huge_bytes()
        first = compiled(x)
        collapse = tori.last_compile().graphs[0].compiled.page_collapse.join(timeout=60)
        assert collapse.regions, "no mapping appeared while the module loaded"
        assert collapse.collapsed >= 32 << 20, collapse
        assert _anon_huge_bytes() - before >= 32 << 20
        torch.testing.assert_close(first, model(x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)  # read from the huge pages
    assert count.compiled_calls == 2 and count.fallback_calls == 0


def test_the_switch_leaves_the_pages_alone_and_a_mapping_seen_before_is_never_touched():
    model, x = _model(), torch.randn(2, 2048)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error", "cache": False})  # off by default
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert tori.last_compile().graphs[0].compiled.page_collapse is None
    assert huge_pages.collapse_new(huge_pages.snapshot()).join().regions == []
    with pytest.raises(OptionsError, match="huge_pages"):
        Options.from_mapping({"huge_pages": "sometimes"})
    assert Options.from_mapping({"huge_pages": "1"}).huge_pages is True and Options().huge_pages is False
