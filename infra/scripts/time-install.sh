#!/usr/bin/env bash
# Time `infra/dev.sh install` cold, then warm: a clean clone of this repository's
# HEAD with empty pip, Go and memq-tools caches (docs/contributing.md, How long
# the install takes). apt packages already on the machine stay: their step is
# timed only where they are missing.
# Usage: time-install.sh [DIR]   DIR (default: a new directory under /tmp) keeps
#                                the clone, its .venv and the caches for a look after.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
dir=${1:-$(mktemp -d /tmp/memq-time-install.XXXXXX)}
git clone -q "$repo" "$dir/src"
export PIP_NO_CACHE_DIR=1 GOPATH=$dir/go GOMODCACHE=$dir/go/pkg/mod GOCACHE=$dir/go-build MEMQ_TOOLS=$dir/tools
cd "$dir/src"
echo "$(git rev-parse --short HEAD) in $dir; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT="cold install: %R s wall, %U s user, %S s sys CPU"
time bash infra/dev.sh install
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
TIMEFORMAT="warm install: %R s wall, %U s user, %S s sys CPU"
time bash infra/dev.sh install
