import atexit
import os
import shutil
import tempfile

import pytest

# Under pytest-xdist (`make test`: two workers on two cores) each worker computes on one
# thread, its child processes too: two workers of two spinning OpenMP threads each
# slowed tests 3-4x, making the parallel suite slower than a serial one.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

# The suite's compile cache is its own, never the user's ~/.cache/tori; it must be set
# before tori.config reads the environment.
os.environ["TORI_CACHE_DIR"] = tempfile.mkdtemp(prefix="tori-test-cache-")
atexit.register(shutil.rmtree, os.environ["TORI_CACHE_DIR"], ignore_errors=True)
os.environ.pop("TORI_CACHE_URL", None)

# timm and transformers import torchvision, whose CUDA build cannot load on CPU torch.
from tori.testing import allow_torchvision_import  # noqa: E402

allow_torchvision_import()
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup` (`make test`): tests marked `xdist_group(name)` run on one
    worker. pytest-xdist 3.8 marks them by setting `item._nodeid`, which pytest 9 no
    longer reads (a node's id is `item._id`), so the groups were lost and each worker
    ran the groups' module fixtures (the OpInfo slice, the distributed ranks) again.
    The group goes into the id here, as xdist's scheduler reads it: `nodeid@name`."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId

    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch.manual_seed(0)
    yield
    torch._dynamo.reset()


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test that mounts a tmpfs (the `tmpfs` fixture), where this process may not
    mount: run it again in a pytest of its own inside a user and mount namespace
    (`unshare`), where it may; the test passes when that run passes."""
    import subprocess
    import sys

    from system_packages import can_mount, can_unshare, missing

    if "tmpfs" not in pyfuncitem.fixturenames or can_mount():
        return None
    if not can_unshare():
        missing("TMPFS", "this process may not mount, and unshare gives no namespace that may")
    basetemp = pyfuncitem.funcargs["tmp_path"] / "namespace"
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-m", "pytest", "-q",
                           "-p", "no:cacheprovider", f"--basetemp={basetemp}", f"--rootdir={pyfuncitem.config.rootpath}",
                           pyfuncitem.nodeid.partition("@")[0]], cwd=pyfuncitem.config.rootpath, capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid} in a mount namespace (unshare) failed:\n{done.stdout[-6000:]}"
                    f"{done.stderr[-2000:]}", pytrace=False)
    if " passed" not in done.stdout:
        pytest.fail(f"{pyfuncitem.nodeid} did not run in the mount namespace:\n{done.stdout[-3000:]}", pytrace=False)
    return True
