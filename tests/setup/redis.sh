#!/usr/bin/env bash
# Installs Debian's redis-server for the shared compile cache tests when it is missing and we are root; quiet, idempotent.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "redis-server is missing and cannot be installed here (needs root and apt-get); the Redis cache tests will be skipped" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
