"""tori.profile and `tori profile`: per-dispatch times from IREE's HAL profiler, with
the torch ops and modules behind each dispatch, rated against the machine's GEMM rate."""

import json
import re

import pytest
import torch
from click.testing import CliRunner
from torch import nn

from tori.cli import main
from tori.tools.profile import ProfileError, contraction_gflop, dispatch_ops, memory_read_gbps, profile

MODEL_FILE = '''
import torch
from torch import nn


def convnet():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(32, 64, 3), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          nn.Flatten(), nn.Linear(64 * 27 * 27, 10)).eval()
    return model, (torch.randn(1, 32, 56, 56),)
'''


@pytest.fixture(scope="module")
def convnet_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "convnet.py"
    path.write_text(MODEL_FILE)
    return path


def _convnet():
    namespace: dict = {}
    exec(MODEL_FILE, namespace)
    return namespace["convnet"]()


def test_profile_times_each_dispatch_and_names_its_ops():
    model, inputs = _convnet()
    with torch.no_grad():
        result = profile(model, *inputs, calls=3)
    assert result.wall_us_per_call > 0 and result.peak_gflops > 10
    # The peak is the higher of the two measured GEMM rates: torch.mm's and tori's own.
    assert result.torch_gemm_gflops > 10 and result.iree_gemm_gflops > 10
    assert result.peak_gflops == max(result.torch_gemm_gflops, result.iree_gemm_gflops)
    assert len(result.dispatches) >= 3
    assert sum(d.share for d in result.dispatches) == pytest.approx(1.0)
    assert result.dispatch_us_per_call == pytest.approx(sum(d.us_per_call for d in result.dispatches))
    # The heaviest dispatches first; the convolution (IREE's channels-last kernel) is rated.
    assert [d.us_per_call for d in result.dispatches] == sorted((d.us_per_call for d in result.dispatches), reverse=True)
    conv = next(d for d in result.dispatches if "aten.convolution.default" in d.ops and d.gflops is not None)
    # Its rate is its work over its time, as a share of the peak; the two are timed apart on
    # a shared machine, so a dispatch timed in a quiet moment may outrun a peak timed in a busy one.
    assert re.search(r"_(conv|matmul)_", conv.name) and conv.gflops > 0
    assert conv.gflops == pytest.approx(contraction_gflop(conv.name) / (conv.us_per_call / conv.invocations_per_call) * 1e6)
    assert conv.fraction_of_peak == pytest.approx(conv.gflops / result.peak_gflops)
    assert any(source.endswith("(Conv2d)") for source in conv.sources)
    linear = next(d for d in result.dispatches if "aten.addmm.default" in d.ops or "aten.mm.default" in d.ops)
    assert "5 (Linear)" in linear.sources
    # IREE names the pooling dispatch `conv`; it is not rated as one.
    pool = next(d for d in result.dispatches if "aten.max_pool2d_with_indices.default" in d.ops and "_conv_" in d.name)
    assert pool.gflops is None


def test_memory_rate_is_measured():
    # A 256 MB float32 sum: far beyond the caches, so a rate of main memory (GB/s).
    assert 0.5 < memory_read_gbps() < 2000


def test_contraction_work_comes_from_the_dispatch_name():
    assert contraction_gflop("main$async_dispatch_4_matmul_2916x64x288_f32") == pytest.approx(2 * 2916 * 64 * 288 / 1e9)
    assert contraction_gflop("main$async_dispatch_9_batch_matmul_3x197x64x197_f32") == pytest.approx(
        2 * 3 * 197 * 64 * 197 / 1e9)
    assert contraction_gflop("main$async_dispatch_1_elementwise_broadcast_2916x64_f32") is None
    # tori's packed matmul (passes/packed_matmul.py): the work of its padded tiles
    assert contraction_gflop("main$async_dispatch_3_mmt4d_113x48x384x14x32x1_f32") == pytest.approx(
        2 * 113 * 14 * 48 * 32 * 384 / 1e9)


def test_dispatch_ops_reads_locations_of_each_executable():
    flow = '''
  flow.executable private @main$async_dispatch_0 {
    flow.executable.export public @main$async_dispatch_0_matmul_4x4x4_f32 workgroups() -> (index, index, index) {
    } loc("aten.mm.default"("module fc (Linear)"))
    %0 = arith.addf %a, %b : f32 loc("aten.relu.default"(callsite("/site-packages/torch/nn/x.py":3:0 at "/home/me/model.py":12:0)))
  }
  flow.executable private @main$async_dispatch_1 {
    flow.executable.export public @main$async_dispatch_1_conv_1x2x2x3x3_f32 workgroups() -> (index, index, index) {
    } loc("aten.max_pool2d_with_indices.default"("module pool (MaxPool2d)"))
  }
  flow.executable private @main$async_dispatch_2 {
    flow.executable.export public @main$async_dispatch_2_mmt4d_1x1x4x14x32x1_f32 workgroups() -> (index, index, index) {
    }
    %4 = linalg.mmt4d ins(%0, %1) loc(callsite("aten.mm.default"("module fc (Linear)") at "aten.mm.default"("module fc (Linear)")))
  }
  flow.executable private @main$async_dispatch_3 {
    flow.executable.export public @main$async_dispatch_3_conv_2x2x4x3x3x4_f32 workgroups() -> (index, index, index) {
    } loc("aten.convolution.default"("module conv (Conv2d)"))
    %5 = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction", "reduction"]} ins(%2, %3 : tensor<4x4x4xf32>, tensor<3x3x4x4xf32>) outs(%4 : tensor<2x2x4xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %6 = arith.mulf %in, %in_0 : f32
      %7 = arith.addf %out, %6 : f32
      linalg.yield %7 : f32
    } -> tensor<2x2x4xf32> loc("aten.max_pool2d_with_indices.default"("module pool (MaxPool2d)"))
  }
  flow.executable private @main$async_dispatch_4 {
    flow.executable.export public @main$async_dispatch_4_conv_2x2x4x3x3_f32 workgroups() -> (index, index, index) {
    } loc("aten.convolution.default"("module conv (Conv2d)"))
    %8 = linalg.generic {indexing_maps = [#map, #map1, #map2], iterator_types = ["parallel", "parallel", "parallel", "reduction", "reduction"]} ins(%2, %3 : tensor<4x4x4xf32>, tensor<3x3xf32>) outs(%4 : tensor<2x2x4xf32>) {
    ^bb0(%in: f32, %in_0: f32, %out: f32):
      %9 = arith.maximumf %in, %out : f32
      linalg.yield %9 : f32
    } -> tensor<2x2x4xf32> loc("aten.max_pool2d_with_indices.default"("module pool (MaxPool2d)"))
    %10 = linalg.generic {indexing_maps = [#map, #map], iterator_types = ["parallel", "parallel", "parallel"]} ins(%8 : tensor<2x2x4xf32>) outs(%4 : tensor<2x2x4xf32>) {
    ^bb0(%in: f32, %out: f32):
      %11 = arith.mulf %in, %in : f32
      linalg.yield %11 : f32
    } -> tensor<2x2x4xf32>
  }'''
    found = dispatch_ops(flow)
    packed = found["main$async_dispatch_2_mmt4d_1x1x4x14x32x1_f32"]
    assert packed.ops == ["aten.mm.default"] and packed.contraction
    first = found["main$async_dispatch_0_matmul_4x4x4_f32"]
    assert first.ops == ["aten.mm.default", "aten.relu.default"] and first.contraction
    assert first.sources == ["model.py:12", "fc (Linear)"]
    assert not found["main$async_dispatch_1_conv_1x2x2x3x3_f32"].contraction
    # A convolution whose input a pooling made (ResNet's first 3x3 after its stem's pooling)
    # carries the pooling's location too: its multiply-add reduction makes it a contraction.
    assert found["main$async_dispatch_3_conv_2x2x4x3x3x4_f32"].contraction
    # A pooling's maximum with the location of the convolution before it is not, whatever
    # elementwise products share its dispatch.
    assert not found["main$async_dispatch_4_conv_2x2x4x3x3_f32"].contraction


def test_profile_refuses_nothing_compiled():
    with pytest.raises(ProfileError, match="calls must be at least 1"):
        profile(nn.ReLU(), torch.randn(3), calls=0)


def test_cli_prints_the_table_and_writes_json_and_a_perfetto_trace(convnet_file, tmp_path):
    out, trace = tmp_path / "profile.json", tmp_path / "profile.pftrace"
    result = CliRunner().invoke(main, ["profile", f"{convnet_file}:convnet", "--calls", "2", "--json", str(out),
                                       "--trace", str(trace)])
    assert result.exit_code == 0, result.output
    assert "us per call" in result.output and "matmul" in result.output and "convolution" in result.output
    data = json.loads(out.read_text())
    assert data["wall_us_per_call"] > 0
    assert {"name", "ops", "us_per_call", "gflops"} <= set(data["dispatches"][0])
    assert trace.stat().st_size > 1000  # Perfetto protobuf with the profiled dispatches


def test_a_dispatch_run_per_layer_is_rated_per_invocation():
    # Three identical layers: IREE runs one dispatch function for two of them.
    torch.manual_seed(0)
    model = nn.Sequential(*(m for _ in range(3) for m in (nn.Linear(256, 256), nn.Tanh()))).eval()
    with torch.no_grad():
        result = profile(model, torch.randn(64, 256), calls=4)
    shared = next(d for d in result.dispatches if d.gflops is not None and d.invocations_per_call == 2)
    work = contraction_gflop(shared.name) * 2  # per call
    assert shared.gflops == pytest.approx(work / (shared.us_per_call * 1e-6), rel=1e-6)
