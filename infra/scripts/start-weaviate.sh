#!/usr/bin/env bash
# Development Weaviate (one node, anonymous access, no modules: memq brings its
# own vectors), on 127.0.0.1, in the foreground (Ctrl-C stops it).
# Usage: start-weaviate.sh [port=8080] [grpc_port=50051]   data: ${MEMQ_DEV_DIR:-~/.memq-dev}/weaviate
# Cluster ports: 7946/7947 (gossip/data) and 8300/8301 (Raft); gRPC and the
# cluster data port listen on all interfaces (Weaviate has no setting for them).
set -euo pipefail
port=${1:-8080}
grpc=${2:-50051}
dir=${MEMQ_DEV_DIR:-$HOME/.memq-dev}/weaviate
version=${WEAVIATE_VERSION:-v1.38.8}
bin=${MEMQ_WEAVIATE_BIN:-${MEMQ_TOOLS:-$HOME/.cache/memq-tools}/weaviate-$version/weaviate-server}
[[ -x $bin ]] || bin=$(command -v weaviate-server) || {
  echo "weaviate-server not found: run infra/scripts/install-weaviate.sh" >&2
  exit 1
}
mkdir -p "$dir"
echo "MEMQ_INDEXING__WEAVIATE__URL=http://127.0.0.1:$port MEMQ_INDEXING__WEAVIATE__GRPC_PORT=$grpc"
# CLUSTER_*_ADDR: a standalone node on loopback (by default it advertises the
# host's first address, and an IPv6 one makes it exit). RAFT_TIMEOUTS_MULTIPLIER=1:
# a lone node elects itself in ~1 s instead of ~9 s. AUTOSCHEMA_ENABLED=false:
# memq creates its collections; a write racing the drop of a generation must
# fail and be retried, not recreate the collection.
export PERSISTENCE_DATA_PATH=$dir \
  AUTHENTICATION_ANONYMOUS_ACCESS_ENABLED=true \
  DEFAULT_VECTORIZER_MODULE=none \
  ENABLE_MODULES= \
  DISABLE_TELEMETRY=true \
  GO_PROFILING_DISABLE=true \
  GRPC_PORT=$grpc \
  CLUSTER_HOSTNAME=node1 \
  CLUSTER_BIND_ADDR=127.0.0.1 \
  CLUSTER_ADVERTISE_ADDR=127.0.0.1 \
  CLUSTER_GOSSIP_BIND_PORT=7946 \
  CLUSTER_DATA_BIND_PORT=7947 \
  RAFT_PORT=8300 \
  RAFT_INTERNAL_RPC_PORT=8301 \
  RAFT_TIMEOUTS_MULTIPLIER=1 \
  AUTOSCHEMA_ENABLED=false
exec "$bin" --host 127.0.0.1 --port "$port" --scheme http
