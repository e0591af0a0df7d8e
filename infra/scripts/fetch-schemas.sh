#!/usr/bin/env bash
# Fetch what tests/unit/test_infra.py checks the deployment files against, from
# the Go module proxy, cached between runs (a no-op when already there):
#   keda/scaledobjects.yaml        KEDA's ScaledObject CRD (its openAPIV3Schema)
#   keda/nats_jetstream_scaler.go  the trigger metadata the nats-jetstream scaler reads
#   keda/scalers_builder.go        the trigger types KEDA knows
#   compose-spec.json              the Compose specification's JSON schema
#   bin/compose-config             the compose-go loader (what `docker compose config` runs):
#                                  schema, interpolation, normalization, consistency
#   bin/kustomize                  what `kubectl apply -k` runs
# Usage: fetch-schemas.sh      prints the directory
#   MEMQ_TOOLS  default ~/.cache/memq-tools  -> $MEMQ_TOOLS/infra-check/
set -euo pipefail
KEDA_VERSION=v2.21.0
COMPOSE_GO_VERSION=v2.16.2
KUSTOMIZE_VERSION=v5.8.1
dir=${MEMQ_TOOLS:-$HOME/.cache/memq-tools}/infra-check
stamp="keda=$KEDA_VERSION compose-go=$COMPOSE_GO_VERSION kustomize=$KUSTOMIZE_VERSION"

if [[ -f $dir/VERSIONS && $(<"$dir/VERSIONS") == "$stamp" ]]; then
  echo "$dir"
  exit 0
fi
if ! command -v go >/dev/null; then
  echo "fetch-schemas.sh: 'go' not found; it fetches the schemas from the Go module proxy (see install-weaviate.sh for installing Go)." >&2
  exit 1
fi

# Fill a temporary directory next to the target, then move it into place: an
# interrupted run never leaves a half-filled cache behind.
mkdir -p "$(dirname "$dir")"
tmp=$(mktemp -d "$dir.tmp.XXXXXX")
chmod 755 "$tmp"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/keda" "$tmp/bin" "$tmp/build"

# The module's unpacked directory in the module cache (`go mod download` needs no go.mod).
module_dir() {
  (cd "$tmp/build" && go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

echo "fetching KEDA $KEDA_VERSION, compose-go $COMPOSE_GO_VERSION, kustomize $KUSTOMIZE_VERSION (once)..." >&2
keda=$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION")
cp "$keda/config/crd/bases/keda.sh_scaledobjects.yaml" "$tmp/keda/scaledobjects.yaml"
cp "$keda/pkg/scalers/nats_jetstream_scaler.go" "$tmp/keda/nats_jetstream_scaler.go"
cp "$keda/pkg/scaling/scalers_builder.go" "$tmp/keda/scalers_builder.go"

compose=$(module_dir "github.com/compose-spec/compose-go/v2@$COMPOSE_GO_VERSION")
cp "$compose/schema/compose-spec.json" "$tmp/compose-spec.json"

# compose-go's own cmd/ loads with LoadModel, which drops the environment (no
# interpolation); this loads a project the way `docker compose config` does
# and prints it as JSON.
cat >"$tmp/build/main.go" <<'GO'
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/compose-spec/compose-go/v2/cli"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: compose-config COMPOSE_FILE  (prints the loaded project as JSON)")
		os.Exit(2)
	}
	file, err := filepath.Abs(os.Args[1])
	if err == nil {
		var options *cli.ProjectOptions
		options, err = cli.NewProjectOptions([]string{file},
			cli.WithWorkingDirectory(filepath.Dir(file)),
			cli.WithOsEnv,
			cli.WithEnvFiles(),
			cli.WithDotEnv,
			cli.WithInterpolation(true),
			cli.WithResolvedPaths(true),
			cli.WithNormalization(true),
			cli.WithConsistency(true),
		)
		if err == nil {
			var out []byte
			project, lerr := options.LoadProject(context.Background())
			if err = lerr; err == nil {
				if out, err = project.MarshalJSON(); err == nil {
					_, err = os.Stdout.Write(out)
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
GO
(
  cd "$tmp/build"
  go mod init memq-infra-check >/dev/null 2>&1
  go mod edit -require="github.com/compose-spec/compose-go/v2@$COMPOSE_GO_VERSION"
  go mod tidy 2>/dev/null || go mod tidy  # again, to show why
  go build -o "$tmp/bin/compose-config" .
)
GOBIN=$tmp/bin go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"

rm -rf "$tmp/build"
echo "$stamp" >"$tmp/VERSIONS"
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
echo "$dir"
