#!/usr/bin/env bash
# Make sure a MySQL-protocol server answers at the URL given (default 127.0.0.1:3306).
# 1. it answers: done;  2. we are root: install/start MariaDB from Debian's packages on
# loopback;  3. otherwise: say what is missing and fail.
# PYFLINK_NDB_MARIADB_OPTS: more options for the instance it starts (ignored when a server
# already answers at the URL), e.g. "--innodb-buffer-pool-size=3G" for the benchmark's
# model of a store that holds its data in memory (README, "User-profile job (part 7)").
# An instance it started keeps its data in var/mariadb-PORT/ (deleted by `make clean`);
# stop it with: kill $(cat var/mariadb-PORT/mysqld.pid)
set -euo pipefail
url="${1:-mysql://root@127.0.0.1:3306/test}"
hostport="${url#*@}"; hostport="${hostport%%/*}"
host="${hostport%%:*}"; port="${hostport##*:}"; [ "$port" = "$host" ] && port=3306
db="${url##*/}"

answers() { timeout 3 bash -c "exec 3<>/dev/tcp/$host/$port" 2>/dev/null; }

if answers; then
  echo "MySQL-protocol server answers at $host:$port"
else
  case "$host" in 127.0.0.1|localhost) ;; *)
    echo "error: nothing answers at $host:$port; start the database there or set PYFLINK_NDB_TEST_MYSQL_URL" >&2; exit 1;;
  esac
  if [ "$(id -u)" != 0 ]; then
    echo "error: no MySQL-protocol server on $host:$port and not root to install one. Start MariaDB/MySQL there (user root, empty password, database $db) or set PYFLINK_NDB_TEST_MYSQL_URL." >&2
    exit 1
  fi
  if [ ! -x /usr/sbin/mariadbd ]; then
    echo "installing mariadb-server from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null
  fi
  # An instance of our own (own data folder, loopback only), so that it neither needs nor
  # disturbs a system server that may run on another port.
  dir="$(cd "$(dirname "$0")/.." && pwd)/var/mariadb-$port"
  mkdir -p "$dir"
  if [ ! -d "$dir/data/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$dir/data" --user=root \
      --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 \
      || { echo "error: mariadb-install-db failed, see $dir/install.log" >&2; exit 1; }
  fi
  nohup /usr/sbin/mariadbd --no-defaults --datadir="$dir/data" --socket="$dir/mysqld.sock" \
    --pid-file="$dir/mysqld.pid" --port="$port" --bind-address=127.0.0.1 --user=root \
    ${PYFLINK_NDB_MARIADB_OPTS:-} >"$dir/mariadbd.log" 2>&1 &
  for _ in $(seq 1 60); do answers && break; sleep 1; done
  answers || { echo "error: MariaDB did not start on $host:$port, see $dir/mariadbd.log" >&2; exit 1; }
  mariadb --no-defaults --socket="$dir/mysqld.sock" -uroot \
    -e "CREATE DATABASE IF NOT EXISTS \`$db\`" || true
  echo "started MariaDB on $host:$port"
fi
# The test database, on the server of the URL (over TCP: the client's default socket may
# be another server's).
if command -v mariadb >/dev/null && [ "$(id -u)" = 0 ]; then
  mariadb --no-defaults --protocol=TCP -h "$host" -P "$port" -uroot \
    -e "CREATE DATABASE IF NOT EXISTS \`$db\`" 2>/dev/null || true
fi
