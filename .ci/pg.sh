#!/usr/bin/env bash
# Start a throw-away PostgreSQL server as the postgres user (it refuses to run as root) on a
# private port and print its URL. Installs the Debian packages when they are missing.
set -euo pipefail
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
port=${PGPORT_TEST:-54329}
data=$(mktemp -d /tmp/dspark-pg.XXXXXX)
chown postgres "$data"
su postgres -s /bin/sh -c "$bin/initdb -D $data -A trust -U postgres >/dev/null"
su postgres -s /bin/sh -c "$bin/pg_ctl -D $data -l $data/log -w -o \"-p $port -k $data -c listen_addresses=127.0.0.1 -c fsync=off\" start >/dev/null"
echo "$data" > /tmp/dspark-pg.last
echo "postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
