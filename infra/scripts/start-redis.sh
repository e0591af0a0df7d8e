#!/usr/bin/env bash
# Development Redis, in the foreground (Ctrl-C stops it).
# Usage: start-redis.sh [port=6379]   data: ${MEMQ_DEV_DIR:-~/.memq-dev}/redis
set -euo pipefail
port=${1:-6379}
dir=${MEMQ_DEV_DIR:-$HOME/.memq-dev}/redis
mkdir -p "$dir"
echo "MEMQ_CACHE__REDIS_URL=redis://127.0.0.1:$port/0"
exec redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --appendonly no
