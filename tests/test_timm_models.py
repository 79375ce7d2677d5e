"""timm classification architectures (random weights, no downloads) through tori with
no fallback, against eager: residual, depthwise-separable, grouped and transformer
networks, at small image sizes so that each compiles in seconds."""

import pytest
import torch

import tori
from subsets import ci_subset
from tori.testing import assert_matches_eager, import_timm, settle_batch_norm

# Deep random-weight networks: compiled kernels reorder float sums.
TOLERANCE = {"rtol": 2e-3, "atol": 2e-3}

MODELS = {
    # name: (timm architecture, extra create_model arguments, image size)
    "resnet18": ("resnet18", {}, 64),
    "mobilenetv3": ("mobilenetv3_small_100", {}, 64),
    "regnety": ("regnety_002", {}, 64),        # grouped convolutions, squeeze-excitation
    "convnext": ("convnext_atto", {}, 64),     # depthwise 7x7, LayerNorm over channels
    "deit": ("deit_tiny_patch16_224", {"img_size": 64}, 64),
}
# CI's two (`make test-extended` runs all five): a residual network and ConvNeXt's
# depthwise convolutions; grouped convolutions are tests/test_decomp_grouped_conv.py's,
# a vision transformer tests/test_real_models.py's. RegNetY (43 s) and MobileNetV3 run
# with `make test-extended`, as benchmarks/bench_models.py's real-model rows do.
IN_CI = {"resnet18", "convnext"}


@pytest.mark.parametrize("name", ci_subset(list(MODELS), IN_CI))
def test_timm_model_matches_eager(name):
    architecture, extra, size = MODELS[name]
    torch.manual_seed(0)
    model = import_timm().create_model(architecture, pretrained=False, num_classes=10, **extra)
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    settle_batch_norm(model, x)
    with torch.no_grad():
        assert_matches_eager(model, x, calls=2, **TOLERANCE)
    graphs = [g for r in tori.compile_records()[-1:] for g in r.graphs]
    assert graphs and all(g.compiled is not None for g in graphs)
    # Code generation was chosen per graph (its op families are recorded).
    assert any(g.codegen is not None and g.codegen.uses for g in graphs)
    # ...and its flags compiled the first time (no second compile on another path).
    assert not [g.codegen.dropped for g in graphs if g.codegen is not None and g.codegen.dropped]
