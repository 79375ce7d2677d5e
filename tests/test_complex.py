"""Complex tensors and the FFT family compiled natively (frontend/complex_values.py,
frontend/decomp/fourier.py): every case compiles with fallback="error", runs on IREE
and matches eager PyTorch; complex inputs and results cross the boundary unchanged."""

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import tori
from tori.errors import CompileError
from tori.frontend.decomp import fourier
from tori.testing import assert_matches_eager, count_graphs


def _complex(*shape, dtype=torch.complex64, seed=0):
    return torch.randn(*shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def test_complex_arithmetic_functions_views_and_reductions():
    z, w, x = _complex(3, 4), _complex(4, seed=1), torch.randn(3, 4)

    def fn(z, w, x):
        return (z + w, z - 2.5, 3 - z, z + x, z * w, z * (1 - 2j), z * x, z / w, x / z, z / 3, -z,
                z.conj() * z, z.abs(), z.angle(), z.exp(), z.log(), z.sqrt(), z.sgn(), z.reciprocal(), z ** 2,
                z ** 3, torch.sin(z), torch.cos(z), z.real * 2, z.imag + 1, z.sum(0), z.mean(1), z.cumsum(1),
                z.t(), z.flip(0), torch.cat([z, x]), torch.where(x > 0, z, 1j), F.pad(z, (1, 2)),
                z.reshape(2, 6), z[:, 1:3], z[1], z == w, z != z.conj(), torch.isfinite(z), z.unsqueeze(0).expand(2, 3, 4))

    assert_matches_eager(fn, z, w, x)


def test_complex_matmuls_batched_and_mixed_with_real():
    a, b, c = _complex(2, 3, 4), _complex(2, 4, 5, seed=1), _complex(4, seed=2)
    real = torch.randn(5, 4)

    def fn(a, b, c, real):
        real = real.to(torch.complex64)  # matmul does not promote: eager refuses mixed dtypes
        return a @ b, a @ c, a[0] @ a[1].mT, a @ real.mT, real @ b, torch.einsum("bij,bjk->bik", a, b)

    assert_matches_eager(fn, a, b, c, real, rtol=1e-5, atol=1e-5)


def test_complex_values_made_from_real_ones_and_rotary_embedding():
    # Llama's rotary embedding as written with view_as_complex.
    q = torch.randn(2, 6, 4, 8)
    frequencies = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    angles = torch.outer(torch.arange(6).float(), frequencies)

    def fn(q, angles):
        rotation = torch.polar(torch.ones_like(angles), angles)
        pairs = torch.view_as_complex(q.reshape(*q.shape[:-1], -1, 2))
        rotated = torch.view_as_real(pairs * rotation[None, :, None, :]).flatten(3)
        made = torch.complex(angles, -angles)
        return rotated, made, angles.to(torch.complex64), angles.to(torch.complex128) * 2, torch.polar(q, q)

    assert_matches_eager(fn, q, angles)


def test_complex_parameters_and_targets():
    # A complex parameter (a graph input on every call), compiled for the CPU and for
    # Vulkan (lavapipe) where it is installed.
    from tori.runtime.devices import available_devices

    layer = torch.nn.Linear(8, 8, dtype=torch.complex64)
    z = _complex(3, 8)
    targets = ["cpu"] + (["vulkan"] if available_devices("vulkan") else [])
    for target in targets:
        with torch.no_grad():
            assert_matches_eager(layer, z, options={"target": target})


@pytest.mark.parametrize("kind", ["complex128", "conjugated", "transposed", "sliced"])
def test_complex_inputs_and_results_cross_the_boundary(kind):
    z = {"complex128": _complex(3, 5, dtype=torch.complex128), "conjugated": _complex(3, 5).conj(),
         "transposed": _complex(5, 3).t(), "sliced": _complex(3, 10)[:, ::2]}[kind]
    actual = assert_matches_eager(lambda z: (z * (2 + 1j), z.abs()), z)
    assert actual[0].dtype == z.dtype and actual[0].shape == z.shape


FFT_CASES = {
    # 1-D, every normalization, odd and short lengths, trimming and padding with n
    "fft": (lambda z: [torch.fft.fft(z, norm=m) for m in ("backward", "ortho", "forward")], (_complex(3, 7),)),
    "fft_real_input": (lambda x: torch.fft.fft(x), (torch.randn(4, 6),)),
    "fft_length_1_and_2": (lambda z: (torch.fft.fft(z[:, :1]), torch.fft.ifft(z[:, :2])), (_complex(3, 4),)),
    "fft_n": (lambda z: (torch.fft.fft(z, n=5), torch.fft.fft(z, n=12, dim=0)), (_complex(8, 8),)),
    "ifft": (lambda z: torch.fft.ifft(z, dim=0, norm="ortho"), (_complex(9, 2),)),
    "rfft_irfft": (lambda x: (torch.fft.rfft(x), torch.fft.irfft(torch.fft.rfft(x), n=x.shape[-1]),
                              torch.fft.irfft(torch.fft.rfft(x), n=10, norm="forward")), (torch.randn(2, 3, 11),)),
    "irfft_odd": (lambda z: torch.fft.irfft(z, n=9), (_complex(4, 5),)),
    "hfft_ihfft": (lambda z, x: (torch.fft.hfft(z), torch.fft.ihfft(x)), (_complex(3, 6), torch.randn(3, 8))),
    # several dims
    "fft2_fftn": (lambda z: (torch.fft.fft2(z), torch.fft.ifftn(z, dim=(0, 2)), torch.fft.fftn(z, s=(4, 4, 4))),
                  (_complex(3, 4, 5),)),
    "rfftn_irfftn": (lambda x: (torch.fft.rfft2(x), torch.fft.irfftn(torch.fft.rfftn(x), s=x.shape)),
                     (torch.randn(2, 6, 7),)),
    "fftshift": (lambda z: (torch.fft.fftshift(torch.fft.fft(z)), torch.fft.ifftshift(z, dim=0)), (_complex(5, 6),)),
    # long lengths: factored (1024 = 32 x 32, 600 = 24 x 25), and a prime (Bluestein)
    "fft_1024": (lambda z: torch.fft.fft(z), (_complex(2, 1024),)),
    "rfft_600": (lambda x: torch.fft.rfft(x, norm="ortho"), (torch.randn(2, 600),)),
    "fft_prime_1031": (lambda z: torch.fft.ifft(z), (_complex(2, 1031),)),
    "irfft_1100": (lambda z: torch.fft.irfft(z, n=1100), (_complex(2, 551),)),
}


@pytest.mark.parametrize("case", FFT_CASES)
def test_fft_family_matches_eager(case):
    fn, inputs = FFT_CASES[case]
    size = max(t.shape[-1] for t in inputs)
    # Sums of n terms: the error grows with the length (the DFT's tables are exact to rounding).
    assert_matches_eager(fn, *inputs, rtol=1e-5 * max(1, math.sqrt(size)), atol=1e-5 * max(1, math.sqrt(size)))


@pytest.mark.parametrize("n, method", [(512, "_direct"), (1024, "_four_step"), (1031, "_bluestein")])
def test_long_transforms_take_the_formulation_for_their_length(n, method, monkeypatch):
    # The three formulations are exact in float64, each checked on the length that selects it.
    calls = []
    original = getattr(fourier, method)
    monkeypatch.setattr(fourier, method, lambda *a, **k: calls.append(n) or original(*a, **k))
    z = _complex(2, n, dtype=torch.complex128)
    re, im = fourier.dft((z.real, z.imag), -1)
    assert calls
    torch.testing.assert_close(torch.complex(re, im), torch.fft.fft(z), rtol=1e-10, atol=1e-10)


STFT_CASES = {
    "centred_reflect": dict(n_fft=64, hop_length=16, window=torch.hann_window(64), return_complex=True),
    "constant_pad_normalized": dict(n_fft=50, hop_length=10, center=True, pad_mode="constant", normalized=True,
                                    return_complex=True),
    "two_sided_no_centre": dict(n_fft=32, hop_length=8, center=False, onesided=False, return_complex=True),
    "short_window": dict(n_fft=64, hop_length=32, win_length=40, window=torch.hamming_window(40),
                         return_complex=True),
    "real_pairs": dict(n_fft=64, hop_length=16, return_complex=False),  # deprecated, still eager's
}


@pytest.mark.parametrize("case", STFT_CASES)
@pytest.mark.filterwarnings("ignore:stft with return_complex=False is deprecated")
def test_stft_matches_eager(case):
    kwargs = STFT_CASES[case]
    assert_matches_eager(lambda x: torch.stft(x, **kwargs), torch.randn(2, 700), rtol=1e-4, atol=1e-4)


def test_istft_inverts_stft_as_eager_does():
    window = torch.hann_window(64)
    spectrum = torch.stft(torch.randn(2, 1000), 64, hop_length=16, window=window, return_complex=True)
    assert_matches_eager(lambda s: (torch.istft(s, 64, hop_length=16, window=window, length=1000),
                                    torch.istft(s, 64, hop_length=16, window=window)), spectrum, rtol=1e-4, atol=1e-4)


def test_gradients_flow_through_complex_values():
    x = torch.randn(3, 16, requires_grad=True)
    weight = torch.randn(9, requires_grad=True)

    def loss(x, weight):
        spectrum = torch.fft.rfft(x) * torch.polar(weight.abs() + 1, weight)
        return torch.fft.irfft(spectrum, n=16).pow(2).sum() + spectrum.abs().sum()

    compiled = torch.compile(loss, backend="tori", options={"fallback": "error"})
    eager_x, eager_w = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with count_graphs() as count:
        value = compiled(x, weight)
        value.backward()
    expected = loss(eager_x, eager_w)
    expected.backward()
    assert count.compiled_graphs == 2 and count.fallback_graphs == 0, count.delta
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x.grad, eager_x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(weight.grad, eager_w.grad, rtol=1e-4, atol=1e-4)


def test_a_complex_op_without_a_rule_is_refused_by_name_and_runs_eagerly_by_default():
    z = _complex(4)
    with pytest.raises(CompileError, match=r"aten tanh.default on complex values has no rule in tori"):
        torch.compile(lambda z: torch.tanh(z * 2), backend="tori", options={"fallback": "error"})(z)
    torch._dynamo.reset()
    with count_graphs() as count:
        out = torch.compile(lambda z: torch.tanh(z * 2) + 1, backend="tori")(z)
    torch.testing.assert_close(out, torch.tanh(z * 2) + 1)
    # Partial fallback: tanh runs eagerly between compiled parts that pass complex values.
    assert count.partitioned_graphs == 1 and count.compiled_parts == 2, count.delta


def test_exported_complex_entry_points_run_without_torch_and_by_dlpack(tmp_path):
    class Filter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.response = torch.nn.Parameter(torch.randn(9, dtype=torch.complex64))
            self.register_buffer("gain", torch.randn(16, 2))  # complex weights held as real pairs

        def forward(self, z):
            spectrum = torch.fft.fft(z, n=16) * torch.view_as_complex(self.gain)
            return torch.fft.ifft(spectrum[..., :9] * self.response, n=16), spectrum.abs()

    model = Filter().eval()
    z = _complex(3, 16)
    path = tori.export(model, (z,), output_dir=tmp_path / "filter", examples=True)
    loaded = tori.runtime.load(path)
    spec = loaded.forward.spec
    assert [i["dtype"] for i in spec["inputs"]] == ["complex64"]
    assert [o["dtype"] for o in spec["outputs"]] == ["complex64", "float32"]
    assert loaded.manifest["format_version"] == 3  # readers before it know no complex dtypes
    with torch.no_grad():
        expected = model(z)
    got = loaded(z.numpy())
    assert got[0].dtype == np.complex64 and got[0].shape == (3, 16)
    np.testing.assert_allclose(got[0], expected[0].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], expected[1].numpy(), rtol=1e-5, atol=1e-5)
    by_dlpack = [torch.from_dlpack(r) for r in loaded.forward.dlpack(z.clone())]
    assert by_dlpack[0].dtype == torch.complex64
    torch.testing.assert_close(by_dlpack[0], expected[0], rtol=1e-5, atol=1e-5)
    # Without torch: numpy complex arrays in and out.
    script = textwrap.dedent(f"""
        import sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "torch_mlir"):
                    raise ImportError(name)
        sys.meta_path.insert(0, Refuse())
        import numpy as np
        import tori.runtime
        artifact = tori.runtime.load({str(path)!r})
        folder = {str(path / "examples" / "forward")!r}
        got = artifact.forward(np.load(folder + "/input_0.npy"))
        expected = [np.load(folder + f"/output_{{i}}.npy") for i in range(2)]
        assert got[0].dtype == np.complex64, got[0].dtype
        print("max_error", max(float(np.abs(g - e).max()) for g, e in zip(got, expected)))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split("max_error")[1]) < 1e-5
