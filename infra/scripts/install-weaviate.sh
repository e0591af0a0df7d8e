#!/usr/bin/env bash
# Install the pinned Weaviate server with `go install` (source from the Go module
# proxy), cached between runs: a no-op when the binary is already there.
# Usage: install-weaviate.sh      prints the binary's path
#   WEAVIATE_VERSION  default v1.38.8
#   MEMQ_TOOLS        default ~/.cache/memq-tools  -> $MEMQ_TOOLS/weaviate-<version>/weaviate-server
set -euo pipefail
version=${WEAVIATE_VERSION:-v1.38.8}
dir=${MEMQ_TOOLS:-$HOME/.cache/memq-tools}/weaviate-$version
bin=$dir/weaviate-server

if [[ -x $bin ]]; then
  echo "$bin"
  exit 0
fi
if ! command -v go >/dev/null; then
  cat >&2 <<MSG
install-weaviate.sh: 'go' not found; Weaviate $version is built from source and needs Go >= 1.25.
  Install Go from https://go.dev/dl/ (unpack the linux tarball into /usr/local, so that
  /usr/local/go/bin/go exists, and add /usr/local/go/bin to PATH; see https://go.dev/doc/install),
  then run this script again. Or point MEMQ_WEAVIATE_BIN at an existing weaviate-server binary.
MSG
  exit 1
fi

# Build into a temporary GOBIN next to the target, then move the binary into
# place: an interrupted build never leaves a half-written binary behind.
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$dir.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "building Weaviate $version with $(go version | cut -d' ' -f3) (a few minutes, once)..." >&2
GOBIN=$tmp go install "github.com/weaviate/weaviate/cmd/weaviate-server@$version" >&2
mkdir -p "$dir"
mv "$tmp/weaviate-server" "$bin"
echo "$bin"
