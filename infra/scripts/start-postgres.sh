#!/usr/bin/env bash
# Development PostgreSQL with a database `memq` (trust auth), in the foreground (Ctrl-C stops it).
# Usage: start-postgres.sh [port=5432]   data: ${MEMQ_DEV_DIR:-~/.memq-dev}/postgres
set -euo pipefail
port=${1:-5432}
dir=${MEMQ_DEV_DIR:-$HOME/.memq-dev}/postgres
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
[[ -x $bin/initdb ]] || bin=$(dirname "$(command -v initdb)") || { echo "PostgreSQL not found: run infra/dev.sh services" >&2; exit 1; }

as=()  # PostgreSQL refuses to run as root: become the postgres user
if [[ $(id -u) == 0 ]]; then as=(runuser -u postgres --); fi

if [[ ! -f $dir/PG_VERSION ]]; then
  mkdir -p "$dir"
  if [[ ${#as[@]} -gt 0 ]]; then
    chown postgres: "$dir"
    "${as[@]}" test -w "$dir" || { echo "user postgres cannot reach $dir: set MEMQ_DEV_DIR, e.g. /var/tmp/memq-dev" >&2; exit 1; }
  fi
  "${as[@]}" "$bin/initdb" -D "$dir" -U postgres -A trust -E UTF8 --no-locale >/dev/null
  echo "CREATE DATABASE memq" | "${as[@]}" "$bin/postgres" --single -D "$dir" -c log_checkpoints=off postgres >/dev/null
fi
echo "MEMQ_DATABASE__URL=postgresql+asyncpg://postgres@127.0.0.1:$port/memq"
exec "${as[@]}" "$bin/postgres" -D "$dir" -p "$port" -c listen_addresses=127.0.0.1 -c unix_socket_directories="$dir"
