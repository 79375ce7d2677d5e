import torch

from tori.testing import assert_matches_eager


def test_linear_relu_runs_compiled():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        assert_matches_eager(model, torch.randn(3, 8), calls=3)
