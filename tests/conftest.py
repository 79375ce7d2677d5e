import atexit
import os
import shutil
import tempfile

import pytest
import torch

# The suite's compile cache is its own, never the user's ~/.cache/tori; it must be set
# before tori.config reads the environment.
os.environ["TORI_CACHE_DIR"] = tempfile.mkdtemp(prefix="tori-test-cache-")
atexit.register(shutil.rmtree, os.environ["TORI_CACHE_DIR"], ignore_errors=True)
os.environ.pop("TORI_CACHE_URL", None)

# timm and transformers import torchvision, whose CUDA build cannot load on CPU torch.
from tori.testing import allow_torchvision_import  # noqa: E402

allow_torchvision_import()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()
