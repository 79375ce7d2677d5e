#!/usr/bin/env bash
# Installs Debian's gcc for the C-embedding export test when no `cc` is found and we are root; quiet, idempotent.
set -euo pipefail
if command -v cc >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "no C compiler, and none can be installed here (needs root and apt-get); the C-embedding test will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
