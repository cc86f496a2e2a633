#!/usr/bin/env bash
# Stop the throw-away PostgreSQL server started by .ci/pg.sh and remove its data.
set -u
data=${1:-$(cat /tmp/dspark-pg.last 2>/dev/null)}
[ -n "$data" ] || exit 0
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
su postgres -s /bin/sh -c "$bin/pg_ctl -D $data -m immediate stop >/dev/null 2>&1" || true
rm -rf "$data"
