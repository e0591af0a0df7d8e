#!/usr/bin/env bash
# Development MariaDB with a database `memq` and user memq/memq, in the foreground (Ctrl-C stops it).
# Usage: start-mariadb.sh [port=3306]   data: ${MEMQ_DEV_DIR:-~/.memq-dev}/mariadb
set -euo pipefail
port=${1:-3306}
dir=${MEMQ_DEV_DIR:-$HOME/.memq-dev}/mariadb
PATH=$PATH:/usr/sbin
as=()  # mariadbd refuses root unless told
if [[ $(id -u) == 0 ]]; then as=(--user=root); fi

if [[ ! -d $dir/data/mysql ]]; then
  mkdir -p "$dir"
  mariadb-install-db --no-defaults "${as[@]}" --datadir="$dir/data" --auth-root-authentication-method=normal \
    --skip-test-db >/dev/null
fi
# Run by the server at every start; idempotent.
cat >"$dir/init.sql" <<'SQL'
CREATE DATABASE IF NOT EXISTS memq CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
CREATE USER IF NOT EXISTS 'memq'@'%' IDENTIFIED BY 'memq';
GRANT ALL PRIVILEGES ON *.* TO 'memq'@'%';
SQL
echo "MEMQ_DATABASE__URL=mysql+asyncmy://memq:memq@127.0.0.1:$port/memq?charset=utf8mb4"
# mariadbd ignores Ctrl-C (SIGINT): turn it into the SIGTERM it shuts down on.
mariadbd --no-defaults "${as[@]}" --datadir="$dir/data" --socket="$dir/mysqld.sock" \
  --pid-file="$dir/mysqld.pid" --port="$port" --bind-address=127.0.0.1 --skip-name-resolve \
  --init-file="$dir/init.sql" --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
  --innodb-use-native-aio=0 &
trap 'kill -TERM $!' INT TERM
wait $! || wait $!  # the first wait returns early when the trap fires
