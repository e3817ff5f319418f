#!/usr/bin/env bash
# A walk-through of running psmr as separate hosts would: three replicas,
# each with its own address, directory, certificate and configuration
# file; then the cluster grows to four, one replica's certificate is
# rotated without a restart, and one replica is removed. On one machine the
# "hosts" are loopback addresses of their own (all of 127.0.0.0/8 is
# loopback on Linux); on real hosts, put each host's directory on it and
# its address in HOSTS.
#
#   bash deploy/walkthrough.sh [WORK_DIR]      # PSMR=path/to/psmr to pick a binary
#
# Each step prints what it does; the script stops at the first failure.
# crates/psmr/tests/cluster_cli.rs runs it.
set -euo pipefail

PSMR=${PSMR:-psmr}
WORK=${1:-$(mktemp -d)}
HOSTS=(127.0.0.11 127.0.0.12 127.0.0.13 127.0.0.14)
CLIENT_PORT=27101
PEER_PORT=27102
mkdir -p "$WORK"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
step() { echo "== $*"; }

# The operator's machine keeps the CA (ca.key never leaves it) and the
# users' passwords; each host gets only its own files.
step "a CA and a certificate per replica, each naming its host"
"$PSMR" certs --dir "$WORK/ca" --ids 1,2,3 --hosts "${HOSTS[0]},${HOSTS[1]},${HOSTS[2]}" >/dev/null
step "an admin user, its password made and kept 0600"
"$PSMR" passwd --user admin --role admin --generate "$WORK/admin.password" >"$WORK/users.toml"

# The members' addresses, as every host reaches them.
members() {
    for id in "$@"; do
        printf '[[replicas]]\nid = %s\nclient = "%s:%s"\npeer = "%s:%s"\n\n' \
            "$id" "${HOSTS[id - 1]}" "$CLIENT_PORT" "${HOSTS[id - 1]}" "$PEER_PORT"
    done
}

# Host ID's directory: its certificate and key, the CA's certificate, and
# a configuration listing MEMBERS... (the same on every host but for the
# paths, which are its own).
host() {
    local id=$1 join=$2
    shift 2
    local dir="$WORK/host-$id"
    install -d -m 0700 "$dir"
    cp "$WORK/ca/ca.pem" "$dir/"
    install -m 0600 "$WORK/ca/replica-$id.key" "$dir/"
    cp "$WORK/ca/replica-$id.pem" "$dir/"
    {
        printf 'storage = "disk"\ndata_dir = "%s/data"\njoin = %s\n\n' "$dir" "$join"
        members "$@"
        printf '[peer_tls]\nca = "%s/ca.pem"\ncert = "%s/replica-{id}.pem"\nkey = "%s/replica-{id}.key"\n\n' \
            "$dir" "$dir" "$dir"
        printf '[client_tls]\ncert = "%s/replica-{id}.pem"\nkey = "%s/replica-{id}.key"\nca = "%s/ca.pem"\n\n' \
            "$dir" "$dir" "$dir"
        cat "$WORK/users.toml"
    } >"$dir/cluster.toml"
}

start() {
    local id=$1
    shift
    RUST_LOG=info "$PSMR" replica --config "$WORK/host-$id/cluster.toml" --id "$id" "$@" \
        >"$WORK/host-$id/out.log" 2>"$WORK/host-$id/replica.log" &
    PIDS[id]=$!
}

export PSMR_USER=admin PSMR_PASSWORD_FILE="$WORK/admin.password" PSMR_TLS_CA="$WORK/ca/ca.pem"
cluster() {
    local list=()
    for id in "$@"; do list+=("${HOSTS[id - 1]}:$CLIENT_PORT"); done
    local IFS=,
    echo "${list[*]}"
}

# Waits (at most 60 s) until `psmr client ARGS` succeeds.
until_ok() {
    for _ in $(seq 600); do
        if "$PSMR" client "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    "$PSMR" client "$@"
}

step "three hosts, each with its own directory, started"
for id in 1 2 3; do host "$id" false 1 2 3; start "$id"; done
export PSMR_CLUSTER=$(cluster 1 2 3)
until_ok --timeout 2 status
"$PSMR" client put greeting hello
[ "$("$PSMR" client get greeting)" = hello ]

step "a fourth host joins: its certificate from the same CA, then add-replica"
"$PSMR" certs --dir "$WORK/ca" --ids 4 --hosts "${HOSTS[3]}" >/dev/null
host 4 true 1 2 3 4
start 4
"$PSMR" client add-replica 4 "${HOSTS[3]}:$CLIENT_PORT" "${HOSTS[3]}:$PEER_PORT" >/dev/null
export PSMR_CLUSTER=$(cluster 1 2 3 4)
[ "$("$PSMR" client members --json | grep -o '"voter":true' | wc -l)" = 4 ]
until_ok --cluster "${HOSTS[3]}:$CLIENT_PORT" status

step "replica 2's certificate rotated in place, without a restart (SIGHUP)"
mkdir -p "$WORK/ca/old" && mv "$WORK/ca/replica-2.pem" "$WORK/ca/replica-2.key" "$WORK/ca/old/"
"$PSMR" certs --dir "$WORK/ca" --ids 2 --hosts "${HOSTS[1]}" >/dev/null
install -m 0600 "$WORK/ca/replica-2.key" "$WORK/host-2/" && cp "$WORK/ca/replica-2.pem" "$WORK/host-2/"
kill -HUP "${PIDS[2]}"
for _ in $(seq 600); do grep -q "certificates reloaded" "$WORK/host-2/replica.log" && break; sleep 0.1; done
grep -q "certificates reloaded" "$WORK/host-2/replica.log"
"$PSMR" client put rotated yes

step "replica 1 removed; the other three go on"
"$PSMR" client remove-replica 1 >/dev/null
export PSMR_CLUSTER=$(cluster 2 3 4)
[ "$("$PSMR" client members --json | grep -o '"id":' | wc -l)" = 3 ]
[ "$("$PSMR" client get greeting)" = hello ]
[ "$("$PSMR" client get rotated)" = yes ]

step "every replica stopped cleanly (SIGTERM)"
for id in 1 2 3 4; do kill -TERM "${PIDS[id]}" 2>/dev/null || true; done
for id in 2 3 4; do wait "${PIDS[id]}"; done
wait "${PIDS[1]}" || true
PIDS=()
echo "walk-through done in $WORK"
