"""The system parts some tests use for real (tests/setup/system-packages.sh installs
them as root): a test whose part is missing skips, saying what to install, unless
`TORI_REQUIRE_<PART>` is set, as `.ci/run` sets each, and then it fails: CI never
passes by skipping them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile

import pytest

_PACKAGES = "bash tests/setup/system-packages.sh as root installs it"
# The parts, by the name of their TORI_REQUIRE_ variable: what each is, and how to get it.
PARTS = {
    "VULKAN": ("a Vulkan device: Debian's mesa-vulkan-drivers and libvulkan1 (lavapipe)", _PACKAGES),
    "REDIS": ("redis-server: Debian's redis-server", _PACKAGES),
    "CHROMIUM": ("a headless browser: Debian's chromium", _PACKAGES),
    "CC": ("a C compiler: Debian's gcc and libc6-dev", _PACKAGES),
    "TMPFS": ("a small tmpfs: `mount` as root, or `unshare` into a user namespace that may mount",
              "run the tests as root, or where unprivileged user namespaces are allowed "
              "(sysctl kernel.unprivileged_userns_clone=1)"),
}


def required(part: str) -> bool:
    return bool(os.environ.get(f"TORI_REQUIRE_{part}"))


def missing(part: str, detail: str = "") -> None:
    """Skip the calling test for want of `part`, or fail it where TORI_REQUIRE_<part> is set."""
    what, how = PARTS[part]
    why = f"needs {what}" + (f" ({detail})" if detail else "")
    if required(part):
        pytest.fail(f"{why}; TORI_REQUIRE_{part} is set, so a missing part is a failure ({how})", pytrace=False)
    pytest.skip(f"{why}; {how}")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@functools.cache
def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, or root of a user namespace)."""
    with tempfile.TemporaryDirectory(prefix="tori-mount-probe-") as probe:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", probe], capture_output=True)
        if done.returncode != 0:
            return False
        subprocess.run(["umount", probe], check=False)
    return True


@functools.cache
def can_unshare() -> bool:
    """Whether `unshare` gives this user a user and mount namespace in which it may mount."""
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory(prefix="tori-unshare-probe-") as probe:
        done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "mount", "-t", "tmpfs", "-o",
                               "size=64k", "tmpfs", probe], capture_output=True)
    return done.returncode == 0
