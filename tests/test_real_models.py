"""Real model architectures from Hugging Face `transformers` (CNNs, vision and text
transformers, decoders), small configs with random weights, through tori with no
fallback, against eager: inference at batch 1 and batch 4 (the second batch size
recompiles with a dynamic batch), and training steps for a CNN and GPT-2.
"""

import copy
import os
from dataclasses import dataclass
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # configs only: nothing is downloaded

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import tori  # noqa: E402
from tori.testing import assert_matches_eager, assert_same_training_state, count_graphs  # noqa: E402

# Compiled kernels reorder float reductions; outputs are of order 1 (measured errors ~1e-6).
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
VOCAB = 128
SEQUENCE = 16
IMAGE = 32


def _lively(model: torch.nn.Module) -> torch.nn.Module:
    """He-initialized convolutions and random BatchNorm statistics and affine terms:
    with the configs' 0.02-std initialization a deep CNN's logits vanish (MobileNetV2's
    were ~1e-26), and default BatchNorm statistics make eval-mode BatchNorm an identity."""
    generator = torch.Generator().manual_seed(1)
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, generator=generator)
        elif isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_(0.0, 0.1, generator=generator)
            module.running_var.uniform_(0.5, 1.5, generator=generator)
            module.weight.data.uniform_(0.5, 1.5, generator=generator)
            module.bias.data.normal_(0.0, 0.1, generator=generator)
    return model


def _images(batch: int, seed: int) -> dict:
    return {"pixel_values": torch.randn(batch, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(seed))}


def _tokens(batch: int, seed: int) -> dict:
    return {"input_ids": torch.randint(0, VOCAB, (batch, SEQUENCE), generator=torch.Generator().manual_seed(seed))}


def _decoder_tokens(batch: int, seed: int) -> dict:
    return {**_tokens(batch, seed), "use_cache": False}


@dataclass(frozen=True)
class RealModel:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[[int, int], dict]  # (batch, seed) -> keyword arguments
    output: str = "logits"


_TEXT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)

MODELS = {
    "resnet": RealModel(
        lambda: _lively(transformers.ResNetForImageClassification(transformers.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10))),
        _images),
    "convnext": RealModel(
        lambda: transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
            num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=IMAGE, num_labels=10)),
        _images),
    "mobilenet_v2": RealModel(
        lambda: _lively(transformers.MobileNetV2ForImageClassification(transformers.MobileNetV2Config(
            depth_multiplier=0.25, image_size=IMAGE, num_labels=10))),
        _images),
    "regnet": RealModel(
        lambda: _lively(transformers.RegNetForImageClassification(transformers.RegNetConfig(
            embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, num_labels=10))),
        _images),
    "vit": RealModel(
        lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
            image_size=IMAGE, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, num_labels=10)),
        _images),
    "swin": RealModel(
        lambda: transformers.SwinForImageClassification(transformers.SwinConfig(
            image_size=IMAGE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4,
            num_labels=10)),
        _images),
    "bert": RealModel(
        lambda: transformers.BertForSequenceClassification(transformers.BertConfig(**_TEXT, num_labels=3)),
        _tokens),
    "distilbert": RealModel(
        lambda: transformers.DistilBertModel(transformers.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=64)),
        _tokens, output="last_hidden_state"),
    "gpt2": RealModel(
        lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)),
        _decoder_tokens),
    "llama": RealModel(
        lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**_TEXT, num_key_value_heads=2)),
        _decoder_tokens),
}
SLOW = {"mobilenet_v2", "swin"}
# CI's architectures (`make test-extended` runs all ten): the transformers' ResNet and
# ConvNeXt have timm's counterparts in tests/test_timm_models.py (whose ConvNeXt has
# MobileNetV2's depthwise convolutions, in 25 s against its 41), DistilBERT is BERT's kind.
IN_CI = {"vit", "swin", "bert", "gpt2", "llama"}


def _case(name: str):
    marks = [pytest.mark.slow] if name in SLOW else []
    return pytest.param(name, marks=marks if name in IN_CI else [*marks, pytest.mark.extended])


@pytest.mark.parametrize("name", [_case(n) for n in MODELS])
def test_inference_matches_eager(name):
    spec = MODELS[name]
    model = spec.build().eval()
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})
    # Batch 1, then batch 4 (a recompile with a dynamic batch), then batch 1 again (its
    # first graph, with new values).
    batches = (1, 4, 1)
    with torch.no_grad(), count_graphs() as count:
        for seed, batch in enumerate(batches):
            inputs = spec.inputs(batch, seed)
            expected = getattr(model(**inputs), spec.output)
            actual = getattr(compiled(**inputs), spec.output)
            assert actual.shape[0] == batch
            torch.testing.assert_close(actual, expected, **TOLERANCE, msg=lambda m: f"batch {batch}: {m}")
    assert count.compiled_graphs >= 2, f"batch 1 and batch 4 should each compile: {count.delta}"
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, f"a graph fell back to eager: {count.delta}"
    assert count.compiled_calls >= len(batches), f"every call should run compiled: {count.delta}"


def test_global_average_pool_of_transposed_input_with_dynamic_batch():
    # Swin's pooler: ATen restrides the 1x1 pool's mean to channels-last with an
    # `as_strided` of symbolic size, which tori drops before FxImporter (it refuses one).
    def pool(x):
        return F.adaptive_avg_pool1d(x.transpose(1, 2), 1).flatten(1)

    assert_matches_eager(pool, torch.randn(4, 16, 32), dynamic=True, **TOLERANCE)


@pytest.mark.parametrize("kv_heads, causal, mask", [(2, True, False), (4, False, True)],
                         ids=["grouped_causal", "float_mask"])
def test_attention_backward_matches_eager(kv_heads, causal, mask):
    # The backward of scaled_dot_product_attention on the CPU is a fused op that IREE
    # does not lower; tori decomposes it (as LLaMA's and BERT's training use it).
    generator = torch.Generator().manual_seed(5)
    query = torch.randn(2, 4, 6, 8, generator=generator)
    key, value = (torch.randn(2, kv_heads, 6, 8, generator=generator) for _ in range(2))
    attn_mask = torch.randn(2, 1, 6, 6, generator=generator) if mask else None

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=causal,
                                              enable_gqa=kv_heads != 4)

    grad_out = torch.randn(2, 4, 6, 8, generator=generator)
    compiled = torch.compile(attend, backend="tori", options={"fallback": "error"})
    results = []
    with count_graphs() as count:
        for fn in (attend, compiled):
            inputs = [t.clone().requires_grad_() for t in (query, key, value)]
            fn(*inputs).backward(grad_out)
            results.append([t.grad for t in inputs])
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0, f"forward and backward should compile: {count.delta}"
    torch.testing.assert_close(results[1], results[0], **TOLERANCE)


def _train(model: torch.nn.Module, batches: list[dict]) -> list[torch.Tensor]:
    """One SGD step per batch, the loss computed by the model from its labels; returns
    the losses and leaves the last step's gradients."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for inputs in batches:
        optimizer.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def _resnet_training():
    model = MODELS["resnet"].build()
    generator = torch.Generator().manual_seed(3)
    return model, [
        {**_images(4, seed), "labels": torch.randint(0, 10, (4,), generator=generator)} for seed in range(2)
    ]


def _gpt2_training():
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))  # no dropout: eager and compiled draw different masks
    batches = []
    for seed in range(2):
        inputs = _decoder_tokens(4, seed)
        batches.append({**inputs, "labels": inputs["input_ids"]})
    return model, batches


@pytest.mark.parametrize("setup", [_resnet_training, _gpt2_training], ids=["resnet", "gpt2"])
def test_training_steps_match_eager(setup):
    eager, batches = setup()
    eager.train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="tori", options={"fallback": "error"})

    expected_losses = _train(eager, batches)
    with count_graphs() as count:
        losses = _train(compiled, batches)

    assert count.compiled_graphs >= 2, f"forward and backward should both compile: {count.delta}"
    assert count.fallback_graphs == 0 and count.fallback_calls == 0, f"a graph fell back to eager: {count.delta}"
    assert count.compiled_calls >= 2 * len(batches), f"every forward and backward should run compiled: {count.delta}"
    torch.testing.assert_close(losses, expected_losses, **TOLERANCE)
    assert_same_training_state(model, eager, **TOLERANCE)


def test_static_cache_decoding_step_compiles_with_the_first_data_tiling_path():
    """transformers' static-cache decoding step selects its attention bias with the
    boolean mask, a graph input; IREE fused that `where` into the attention matmul's
    data-tiled epilogue and failed on the i1 input's encoding ("'linalg.pack' op
    expected padding_value has 'i8' but got: 'i1'"), and the step was compiled again
    with IREE's other data-tiling path. tori-materialize-masks computes the bias in a
    dispatch of its own."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from real_models import llama_config

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    prompt = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(1))
    settings = dict(max_new_tokens=3, min_new_tokens=3, do_sample=False, cache_implementation="static",
                    pad_token_id=0)
    with torch.no_grad():
        expected = model.generate(prompt, **settings)
        eager_forward = model.forward
        model.forward = torch.compile(eager_forward, backend="tori", options={"fallback": "error", "cache": False})
        with count_graphs() as count:
            tokens = model.generate(prompt, **settings)
        model.forward = eager_forward
    assert torch.equal(tokens, expected)
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0, count.delta  # prefill, then each step
    for record in tori.compile_records()[-2:]:
        flags = record.graphs[-1].iree_invocation.flags
        assert "--iree-opt-data-tiling=true" in flags and "--iree-global-opt-data-tiling" not in flags, flags
