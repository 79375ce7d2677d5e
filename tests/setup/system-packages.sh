#!/usr/bin/env bash
# The Debian packages that tests use for real: lavapipe and the Vulkan loader (Vulkan on
# the CPU), chromium (the report's browser test), a C compiler (the C-embedding export
# test), redis-server (the shared compile cache tests). Installs the missing ones with one
# apt-get run, as root only; quiet and idempotent. Exits 0 either way: without a package
# its tests skip, saying why, except where TORI_REQUIRE_<PART> is set (.ci/run sets them
# all; tests/system_packages.py), and then they fail.
set -u
PACKAGES=(libvulkan1 mesa-vulkan-drivers chromium gcc libc6-dev redis-server)

have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for pkg in "${PACKAGES[@]}"; do have "$pkg" || missing+=("$pkg"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" -ne 0 ]; then
    echo "note: ${missing[*]} missing and not root (or no apt-get): the tests that need them will be skipped" >&2
    exit 0
fi
echo "installing ${missing[*]} for the tests" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || echo "warning: could not install ${missing[*]}: the tests that need them will be skipped" >&2
exit 0
