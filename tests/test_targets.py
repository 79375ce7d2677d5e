"""Targets: the flags table and its options, every benchmark model compiled for
CPU, CUDA, ROCm and Vulkan (CUDA and ROCm cross-compiled and checked by what the
module holds, Vulkan run on lavapipe against eager), device choice by the inputs,
and the errors for targets and devices that are not there.
"""

import os
import re
import sys
import threading
from pathlib import Path

import pytest
import torch

import tori
from tori.config import from_environment
from tori.errors import OptionsError, ToriRuntimeError
from tori.runtime import devices
from tori.targets import SPECS, Target, spec
from tori.targets.build import check_compiled_in
from tori.targets.inspect import inspect_vmfb
from tori.targets.iree_compile import compile_flags
from tori.testing import assert_matches_eager

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from models import MODELS  # noqa: E402
from subsets import ci_subset  # noqa: E402

# The benchmark models CI runs on Vulkan and exports for every target (`make
# test-extended` runs them all): convolutions, attention, the FFT's constant tables (the
# spectrogram runs on Vulkan and cross-compiles for CUDA and ROCm in CI, exports in extended).
VULKAN_IN_CI = {"mlp", "tiny_linear", "cnn_bn", "transformer_layer", "spectrogram"}
EXPORT_IN_CI = {"mlp", "tiny_linear", "cnn_bn", "hand_attention"}

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
CPU = torch.device("cpu")
DEFAULT_ARCH = {Target.CUDA: "sm_80", Target.ROCM: "gfx942"}


def _vulkan_devices() -> list:
    try:
        return devices.available_devices("vulkan")
    except ToriRuntimeError:
        return []


HAVE_VULKAN = bool(_vulkan_devices())
ON_LAVAPIPE = HAVE_VULKAN and _vulkan_devices()[0].get("name", "").startswith("llvmpipe")
if not HAVE_VULKAN and os.environ.get("TORI_REQUIRE_VULKAN"):
    raise RuntimeError("TORI_REQUIRE_VULKAN is set but IREE finds no Vulkan device: install mesa-vulkan-drivers")
requires_vulkan = pytest.mark.skipif(
    not HAVE_VULKAN, reason="no Vulkan device: install Debian's mesa-vulkan-drivers (lavapipe), as `make test` does as root")
requires_lavapipe = pytest.mark.skipif(not ON_LAVAPIPE, reason="the Vulkan device here is not lavapipe")


def _cuda_device() -> bool:
    try:
        return torch.cuda.is_available() and bool(devices.available_devices("cuda"))
    except ToriRuntimeError:
        return False


requires_cuda = pytest.mark.skipif(not _cuda_device(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh)")


def _check_module(target: Target, vmfb: bytes, arch: str | None = None) -> None:
    contents = inspect_vmfb(vmfb)
    fmt = spec(target).executable_format
    assert contents.formats and all(f.startswith(fmt) for f in contents.formats), contents
    assert contents.executables_of(fmt), f"no {fmt} executable in the {target} module: {contents}"
    assert contents.entry_points, contents
    if target in DEFAULT_ARCH:
        assert contents.gpu_archs == (arch or DEFAULT_ARCH[target],), contents
    if target is Target.VULKAN:
        assert contents.spirv_modules >= len(contents.executables_of(fmt))


@pytest.mark.parametrize("name", ci_subset(list(MODELS), VULKAN_IN_CI))
def test_benchmark_model_runs_on_vulkan_and_cross_compiles_for_cuda_and_rocm(name):
    model, inputs = MODELS[name].build(), MODELS[name].example_inputs()
    runs_on = Target.VULKAN if HAVE_VULKAN else Target.CPU
    with torch.no_grad():
        assert_matches_eager(model, *inputs, options={"target": runs_on.value, "targets": ["cuda", "rocm"]},
                             **TOLERANCE)
    graph = tori.last_compile().forward.compiled
    assert graph.targets == (runs_on, Target.CUDA, Target.ROCM)
    assert graph.graph_for(CPU).target is runs_on
    for target, vmfb in graph.vmfbs.items():
        _check_module(target, vmfb)


def test_weight_only_int8_layers_run_on_vulkan_and_cross_compile_for_cuda_and_rocm():
    """The int8 weights' CPU contraction (tori-int8-weight-matmul) is for CPU-only
    compiles: IREE's SPIR-V codegen failed to tile it to invocations."""
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    quantize_(model, Int8WeightOnlyConfig())
    runs_on = Target.VULKAN if HAVE_VULKAN else Target.CPU
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(1, 64), options={"target": runs_on.value, "targets": ["cuda", "rocm"]},
                             **TOLERANCE)
    graph = tori.last_compile().forward.compiled
    assert graph.targets == (runs_on, Target.CUDA, Target.ROCM)
    for target, vmfb in graph.vmfbs.items():
        _check_module(target, vmfb)


@requires_lavapipe
@pytest.mark.parametrize("name", ["transformer_layer", "hand_attention"])
def test_portable_baseline_on_lavapipe_refuses_bool_tensors_rather_than_answer_wrongly(name):
    # On vp_android_baseline_2022 IREE packs bools into 32-bit words, which lavapipe
    # reads back stale: transformer_layer's safe-softmax all() came out wrong by 0.22.
    model, inputs = MODELS[name].build(), MODELS[name].example_inputs()
    options = {"target": "vulkan", "vulkan_target": "vp_android_baseline_2022", "fallback": "error"}
    with torch.no_grad(), pytest.raises(tori.errors.CompileError,
                                        match="i1 tensors are not supported on target 'vulkan'.*vp_android_baseline_2022"):
        torch.compile(model, backend="tori", options=options)(*inputs)


@requires_vulkan
def test_bool_reductions_on_vulkan_match_eager():
    x = torch.randn(4, 4, 64, 64)
    x[0, 0, 3] = float("-inf")
    assert_matches_eager(lambda s: torch.where((s == float("-inf")).all(-1, keepdim=True), 0.0, s.softmax(-1)), x,
                         options={"target": "vulkan"}, **TOLERANCE)
    assert_matches_eager(lambda s: (s > -10).all(-1), x, options={"target": "vulkan"})


def test_one_artifact_for_four_targets_runs_cpu_tensors_on_the_cpu():
    model, inputs = MODELS["mlp"].build(), MODELS["mlp"].example_inputs()
    with torch.no_grad():
        assert_matches_eager(model, *inputs, options={"targets": ["cpu", "cuda", "vulkan", "rocm"]}, **TOLERANCE)
    graph = tori.last_compile().forward.compiled
    assert graph.targets == (Target.CPU, Target.CUDA, Target.VULKAN, Target.ROCM)
    assert graph.graph_for(CPU).target is Target.CPU
    for target, vmfb in graph.vmfbs.items():
        _check_module(target, vmfb)


@requires_vulkan
def test_vulkan_results_are_cpu_tensors_of_eager_dtypes():
    def fn(x, n):
        return (x * 2).sum(-1), x > 0, n.to(torch.int32) + 1

    x, n = torch.randn(5, 7), torch.arange(6)
    out = assert_matches_eager(fn, x, n, options={"target": "vulkan"}, calls=2)
    assert all(t.device == CPU for t in out)
    assert [t.dtype for t in out] == [torch.float32, torch.bool, torch.int32]


@requires_lavapipe
def test_vulkan_half_precision_matches_eager_on_lavapipe_and_the_baseline_refuses_it():
    model, inputs = MODELS["mlp"].build().half(), MODELS["mlp"].example_inputs()[0].half()
    with torch.no_grad():
        assert_matches_eager(model, inputs, options={"target": "vulkan"}, rtol=1e-2, atol=1e-3)
    with pytest.raises(tori.errors.CompileError, match="f16 tensors are not supported on target 'vulkan'"):
        torch.compile(lambda x: x.half() * 2, backend="tori",
                      options={"target": "vulkan", "vulkan_target": "vp_android_baseline_2022", "fallback": "error"})(
            torch.randn(4))


@requires_vulkan
def test_vulkan_refuses_bfloat16_rather_than_answer_wrongly():
    with pytest.raises(tori.errors.CompileError, match="bf16 tensors are not supported on target 'vulkan'"):
        torch.compile(lambda x: x.bfloat16() * 2, backend="tori", options={"target": "vulkan", "fallback": "error"})(
            torch.randn(4))


@requires_vulkan
def test_vulkan_training_steps_match_eager():
    # Forward and backward graphs on Vulkan; parameters are uploaded again after each optimizer step.
    model = MODELS["mlp"].build().train()
    inputs = MODELS["mlp"].example_inputs()[0]
    compiled = torch.compile(model, backend="tori", options={"target": "vulkan", "fallback": "error"})
    eager = MODELS["mlp"].build().train()
    for m in (compiled, eager):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            optimizer.zero_grad()
            m(inputs).square().mean().backward()
            optimizer.step()
    for (name, param), expected in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(param, expected, **TOLERANCE, msg=lambda m: f"{name}: {m}")


def test_flags_table_and_overrides():
    assert compile_flags(Target.CPU)[-3:] == ["--iree-hal-target-device=local",
                                             "--iree-hal-local-target-device-backends=llvm-cpu",
                                             "--iree-llvmcpu-target-cpu=host"]
    assert compile_flags(Target.CUDA, "sm_86")[-2:] == ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_86"]
    assert compile_flags(Target.ROCM)[-2:] == ["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"]
    host_vulkan = "llvmpipe" if ON_LAVAPIPE else "vp_android_baseline_2022"  # vulkan_target="host"
    assert compile_flags(Target.VULKAN)[-2:] == ["--iree-hal-target-device=vulkan", f"--iree-vulkan-target={host_vulkan}"]
    assert compile_flags(Target.VULKAN, "rdna3")[-1] == "--iree-vulkan-target=rdna3"
    assert "--iree-input-demote-f64-to-f32=true" in compile_flags(Target.VULKAN)
    assert "--iree-input-demote-f64-to-f32=false" in compile_flags(Target.CPU)
    check_compiled_in(tuple(SPECS))  # all four backends are in this IREE build


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
def test_hopper_compiles_through_a_derived_device_target(arch):
    # IREE 3.13 rejects --iree-cuda-target=sm_90 ("missing GPU target"); tori passes the
    # whole device target, sm_89's description naming sm_90, and gets sm_90 PTX.
    flags = compile_flags(Target.CUDA, arch)
    assert flags[-1].startswith('--iree-hal-target-device=#hal.device.target<"cuda"') and f'arch = "{arch}"' in flags[-1]
    with torch.no_grad():
        model, inputs = MODELS["mlp"].build(), MODELS["mlp"].example_inputs()
        assert_matches_eager(model, *inputs, options={"targets": ["cuda"], "cuda_arch": arch}, **TOLERANCE)
    _check_module(Target.CUDA, tori.last_compile().forward.compiled.vmfbs[Target.CUDA], arch)


def test_options_name_targets_and_per_target_settings():
    options = tori.Options.from_mapping({"target": "vulkan", "targets": "cpu, cuda", "cuda_arch": "sm_86",
                                         "rocm_chip": "gfx90a"})
    assert options.target is Target.VULKAN and options.targets == (Target.CPU, Target.CUDA)
    assert (options.cuda_arch, options.rocm_chip) == ("sm_86", "gfx90a")
    env = from_environment({"TORI_TARGET": "rocm", "TORI_TARGETS": "cpu,vulkan", "TORI_VULKAN_TARGET": "rdna3"})
    assert (env.target, env.targets, env.vulkan_target) == (Target.ROCM, (Target.CPU, Target.VULKAN), "rdna3")


@pytest.mark.parametrize("options", [{"target": "tpu"}, {"targets": ["cpu", "metal"]}])
def test_unknown_target_names_the_targets(options):
    with pytest.raises(OptionsError) as raised:
        tori.compile(lambda x: x + 1, options=options)
    assert all(t.value in str(raised.value) for t in Target)


def test_unknown_cuda_arch_is_an_options_error():
    with pytest.raises(OptionsError, match="iree-compile rejects cuda_arch 'l4'.*sm_80"):
        torch.compile(lambda x: x + 1, backend="tori", options={"targets": ["cuda"], "cuda_arch": "l4"})(torch.ones(2))


def test_cpu_tensors_for_a_gpu_only_module_get_a_clear_error():
    compiled = torch.compile(lambda x: x * 2, backend="tori", options={"target": "cuda", "fallback": "error"})
    with pytest.raises(ToriRuntimeError, match="compiled for cuda only.*drivers in this build: .*local-sync"):
        compiled(torch.ones(3))


@pytest.mark.skipif(_cuda_device(), reason="this machine has a CUDA device")
def test_missing_device_names_the_drivers_and_devices():
    with pytest.raises(ToriRuntimeError) as raised:
        devices.device("cuda")
    message = str(raised.value)
    assert "cuda" in message and "local-sync (host CPU)" in message
    for driver in devices.available_drivers():
        assert driver in message


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("name", list(MODELS))
def test_cuda_tensors_run_on_cuda_and_stay_there(name):
    model, inputs = MODELS[name].build().cuda(), tuple(t.cuda() for t in MODELS[name].example_inputs())
    with torch.no_grad():
        out = assert_matches_eager(model, *inputs, options={"target": "cuda"}, **TOLERANCE)
    assert out.device == inputs[0].device


@pytest.mark.gpu
@requires_cuda
def test_one_artifact_follows_the_inputs_between_cpu_and_cuda():
    model = MODELS["mlp"].build()
    x = MODELS["mlp"].example_inputs()[0]
    compiled = torch.compile(model, backend="tori", options={"targets": ["cpu", "cuda"], "fallback": "error"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), **TOLERANCE)
        model.cuda()
        out = compiled(x.cuda())
        assert out.is_cuda
        torch.testing.assert_close(out, model(x.cuda()), **TOLERANCE)


# --- every path, every target: flags from one place, per-target default pipelines ---

# The architecture flag each target's modules must be compiled with (None: its default).
ARCHS = ((Target.CPU, None), (Target.CUDA, "sm_80"), (Target.CUDA, "sm_90"), (Target.ROCM, "gfx942"),
         (Target.VULKAN, None))


def _arch_options(target: Target, arch: str | None) -> dict:
    return {spec(target).arch_option: arch} if arch else {}


@pytest.mark.parametrize("name", ci_subset(list(MODELS), EXPORT_IN_CI))
def test_every_benchmark_model_inspects_and_exports_for_every_target(name, tmp_path):
    model, inputs = MODELS[name].build().eval(), MODELS[name].example_inputs()
    for target, arch in ARCHS:
        options = _arch_options(target, arch)
        shown = tori.compiler.inspect(model, *inputs, stages=["iree"], target=target.value, options=options)
        command = shown.graphs[0]["iree"].splitlines()[0]
        expected = compile_flags(target, arch or getattr(tori.Options(), spec(target).arch_option))[-1]
        assert expected in command, (target, arch, command)
    # One artifact for ROCm and Vulkan; the cuda (sm_90 and sm_80 PTX) and cpu artifacts of
    # every benchmark model are exported and checked by tests/test_gpu_bundle.py.
    with torch.no_grad():
        first = tori.export(model, tuple(inputs), targets=("rocm", "vulkan"), output_dir=tmp_path / "all",
                            options={"rocm_chip": "gfx942"})
    for target in (Target.ROCM, Target.VULKAN):
        _check_module(target, (first / f"{target.value}.vmfb").read_bytes(), DEFAULT_ARCH.get(target))


def test_gpu_targets_fuse_attention_by_default_and_an_explicit_pipeline_wins(tmp_path):
    from tori.config import DEFAULT_PIPELINE, GPU_PIPELINE

    model, inputs = MODELS["hand_attention"].build().eval(), MODELS["hand_attention"].example_inputs()
    assert tori.Options.from_mapping({"target": "cuda"}).tori_pipeline == GPU_PIPELINE
    assert tori.Options.from_mapping({"target": "rocm"}).tori_pipeline == GPU_PIPELINE
    assert tori.Options.from_mapping({"target": "cpu"}).tori_pipeline == DEFAULT_PIPELINE
    # One module for several targets: the fusions only where every target takes them.
    assert tori.Options.from_mapping({"target": "cuda", "targets": ["rocm"]}).tori_pipeline == GPU_PIPELINE
    assert tori.Options.from_mapping({"target": "rocm", "targets": ["vulkan"]}).tori_pipeline == DEFAULT_PIPELINE
    kinds = {}
    for label, targets, options in (("cuda", ("cuda",), {}), ("rocm", ("rocm",), {}), ("cpu", ("cpu",), {}),
                                    ("cuda, explicit", ("cuda",), {"pipeline": DEFAULT_PIPELINE})):
        with torch.no_grad():
            out = tori.export(model, tuple(inputs), targets=targets, output_dir=tmp_path / label.replace(", ", "-"),
                              options=options)
        vmfb = (out / f"{targets[0]}.vmfb").read_bytes()
        # IREE cuts an entry's name at 32 characters: "forward$async_dispatch_5_attenti".
        kinds[label] = sum(bool(re.search(r"_dispatch_\d+_attenti", entry)) for entry in inspect_vmfb(vmfb).entry_points)
    # IREE's fused attention dispatch on the GPU targets; the CPU, and a pipeline named
    # without the fusion, keep the matmul + softmax + matmul dispatches.
    assert kinds["cuda"] >= 1 and kinds["rocm"] >= 1, kinds
    assert kinds["cpu"] == 0 and kinds["cuda, explicit"] == 0, kinds


# The CPU's features (targets/cpu.py): an iree-compile probe per CPU name and process,
# started by the backend so that it runs while AOTAutograd traces.

def test_a_cpus_features_are_probed_once_however_many_ask_at_once(monkeypatch):
    from tori.targets import cpu

    monkeypatch.delitem(cpu._RESOLVED, "znver2", raising=False)
    probes, probe = [], cpu._probe
    monkeypatch.setattr(cpu, "_probe", lambda *args: probes.append(args) or probe(*args))
    cpu.resolve_in_background("znver2")
    seen = []
    askers = [threading.Thread(target=lambda: seen.append(cpu.cpu_features("znver2"))) for _ in range(4)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(timeout=120)
    assert len(probes) == 1 and len(seen) == 4 and len(set(seen)) == 1, (probes, seen)
    assert "+avx2" in seen[0] and "+avx512f" not in seen[0]  # Zen 2


def test_a_failed_cpu_probe_raises_for_its_caller_and_the_next_call_probes_again(monkeypatch):
    from tori.targets import cpu, iree_compile

    monkeypatch.delitem(cpu._RESOLVED, "znver1", raising=False)
    with monkeypatch.context() as broken:
        broken.setattr(iree_compile, "iree_compile_tool", lambda: "/nonexistent/iree-compile")
        with pytest.raises(FileNotFoundError):
            cpu.cpu_features("znver1")
    assert "znver1" not in cpu._RESOLVED
    assert "+avx2" in cpu.cpu_features("znver1")


def test_compiling_for_a_cpu_resolves_its_features_even_where_no_rule_asks_for_them(monkeypatch):
    from tori.targets import cpu

    monkeypatch.delitem(cpu._RESOLVED, "x86-64-v3", raising=False)
    assert_matches_eager(lambda x: x * 2 + 1, torch.randn(8), options={"cpu": "x86-64-v3", "cache": False})
    assert "+avx2" in cpu._RESOLVED["x86-64-v3"].result(timeout=120)
