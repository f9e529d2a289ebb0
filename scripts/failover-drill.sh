#!/usr/bin/env bash
# Usage: scripts/failover-drill.sh [ROUNDS] [WORKERS]
#        scripts/failover-drill.sh --short      (one failover, as fast as it goes: scripts/test.sh)
#        scripts/failover-drill.sh --async      (Patroni's default, asynchronous replication:
#                                                `airlock verify` must FAIL it; no load)
#
# The PostgreSQL failover drill (docs/deployment.md#postgresql-failover): etcd and two
# Patroni-managed PostgreSQL 15 nodes on loopback with synchronous replication
# (synchronous_mode_strict), two `airlock serve` instances on a multi-host DSN
# (host=a,b target_session_attrs=read-write), and scripts/failover-load: a recording
# provider (every request stored under its Idempotency-Key, never deduplicated) and WORKERS
# clients claiming fresh runs through both instances and queueing an effect on each (one in
# three gated: an approver signed in decides it, one in four of those a rejection), every
# request with an Idempotency-Key, retried on 503. Each round SIGKILLs the primary's
# postmaster and its Patroni agent (the node is lost), waits for Patroni to promote the
# replica, then starts the old node's agent again, which rejoins as the synchronous standby
# (pg_rewind). At the end the load program waits for the outbox to settle, resolves what
# stays unknown from the provider's records (as an operator would), and reports:
# acknowledged writes lost, effects stored twice by the provider, unknowns created and how
# they were settled, client-visible statuses, per round the time from the kill to writes
# coming back, and when each instance's LISTEN heard a NOTIFY again after the promotion.
# Exits non-zero if an acknowledged write was lost, an effect was stored twice, an effect
# stayed open, or a client saw a 5xx other than 503.
# Needs: apt-get install -y patroni etcd-server python3-etcd (and PostgreSQL 15). Root
# or not: the database side runs as the postgres user when run as root. Missing parts make
# it exit 2 (scripts/test.sh skips the short form then, except under CI=true).
set -euo pipefail

SHORT= ASYNC=
if [ "${1:-}" = --short ]; then
	SHORT=1
	shift
elif [ "${1:-}" = --async ]; then
	SHORT=1 ASYNC=1
	shift
fi
ROUNDS=${1:-3}
WORKERS=${2:-4}
# Patroni's leader key ttl bounds how soon the replica is promoted; the short form uses
# the smallest that keeps loop_wait + 2 × retry_timeout within it.
TTL=10 RETRY=4 PAUSE=5 SETTLE=120s
if [ -n "$SHORT" ]; then
	ROUNDS=1 WORKERS=2 TTL=6 RETRY=2 PAUSE=1 SETTLE=60s
fi
cd "$(dirname "$0")/.."
T0=$SECONDS
log() { printf 'drill: [%3d s] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

for b in etcd patroni curl psql; do command -v "$b" >/dev/null || { log "$b not found (apt-get install -y patroni etcd-server python3-etcd)"; exit 2; }; done
/usr/bin/python3 -c 'import etcd' 2>/dev/null || { log "python3-etcd not found (apt-get install -y python3-etcd)"; exit 2; }
BINDIR=$(printf '%s\n' /usr/lib/postgresql/15/bin | head -n1)
[ -x "$BINDIR/postgres" ] || { log "PostgreSQL 15 binaries not found in $BINDIR"; exit 2; }

W=$(mktemp -d /tmp/airlock-drill-XXXXXX)
chmod 755 "$W"
AS=()
if [ "$(id -u)" -eq 0 ]; then
	chown postgres "$W"
	AS=(setpriv --reuid=postgres --regid=postgres --init-groups)
fi
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for n in 1 2; do
		[ -f "$W/pg$n/postmaster.pid" ] && kill -9 "$(head -n1 "$W/pg$n/postmaster.pid")" 2>/dev/null || true
	done
	sleep 1
	if [ -n "${DRILL_KEEP:-}" ]; then log "kept $W"; else rm -rf "$W"; fi
}
trap cleanup EXIT

free() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
EC=$(free) EP=$(free) P1=$(free) P2=$(free) R1=$(free) R2=$(free) H1=$(free) H2=$(free)
PORT_1=$P1 PORT_2=$P2 REST_1=$R1 REST_2=$R2

"${AS[@]}" etcd --name e --data-dir "$W/etcd" --enable-v2=true \
	--listen-client-urls "http://127.0.0.1:$EC" --advertise-client-urls "http://127.0.0.1:$EC" \
	--listen-peer-urls "http://127.0.0.1:$EP" --initial-advertise-peer-urls "http://127.0.0.1:$EP" \
	--initial-cluster "e=http://127.0.0.1:$EP" >"$W/etcd.log" 2>&1 &
PIDS+=($!)

SYNC=true
[ -z "$ASYNC" ] || SYNC=false
node_yml() { # node port rest
	cat >"$W/n$1.yml" <<Y
scope: drill
name: n$1
restapi: {listen: 127.0.0.1:$3, connect_address: 127.0.0.1:$3}
etcd: {host: 127.0.0.1:$EC}
bootstrap:
  dcs:
    ttl: $TTL
    loop_wait: 1
    retry_timeout: $RETRY
    synchronous_mode: $SYNC
    synchronous_mode_strict: $SYNC
    postgresql:
      use_pg_rewind: true
      parameters: {wal_log_hints: 'on', max_wal_senders: 5, max_replication_slots: 5}
  initdb: [{encoding: UTF8}, {auth: trust}]
  pg_hba: [host all all 127.0.0.1/32 trust, host replication all 127.0.0.1/32 trust, local all all trust]
postgresql:
  listen: 127.0.0.1:$2
  connect_address: 127.0.0.1:$2
  data_dir: $W/pg$1
  bin_dir: $BINDIR
  basebackup: [{checkpoint: fast}]
  pgpass: $W/pgpass$1
  authentication:
    superuser: {username: postgres, password: x}
    replication: {username: postgres, password: x}
    rewind: {username: postgres, password: x}
  parameters: {unix_socket_directories: '$W'}
Y
}
declare -A AGENT
start_agent() { # node
	"${AS[@]}" patroni "$W/n$1.yml" >>"$W/patroni$1.log" 2>&1 &
	AGENT[$1]=$!
	PIDS+=($!)
}
node_yml 1 "$P1" "$R1"
node_yml 2 "$P2" "$R2"

# role NODE: leader, sync_standby, replica, … as the cluster reports it (empty when unknown)
cluster() { curl -sf "http://127.0.0.1:$REST_1/cluster" 2>/dev/null || curl -sf "http://127.0.0.1:$REST_2/cluster" 2>/dev/null || true; }
leader() { cluster | python3 -c 'import json,sys
try: m=json.load(sys.stdin)["members"]
except Exception: sys.exit(0)
print("".join(x["name"][1:] for x in m if x["role"]=="leader" and x["state"]=="running"))'; }
healthy() { cluster | python3 -c 'import json,sys
try: m=json.load(sys.stdin)["members"]
except Exception: sys.exit(1)
r=sorted((x["role"],x["state"]) for x in m)
want=sys.argv[1]
sys.exit(0 if r==[("leader","running"),(want,"running")] or r==[("leader","running"),(want,"streaming")] else 1)' "${STANDBY_ROLE:-sync_standby}"; }
is_leader() { [ "$(leader)" = "$1" ]; }
wait_for() { # seconds cmd...
	local until=$((SECONDS + $1)); shift
	until "$@"; do [ $SECONDS -lt $until ] || return 1; sleep 0.5; done
}
# The binaries build while the first node bootstraps.
(GOTOOLCHAIN=local go build -o "$W/airlock" ./cmd/airlock && GOTOOLCHAIN=local go build -o "$W/failover-load" ./scripts/failover-load) >"$W/build.log" 2>&1 &
BUILD=$!
PIDS+=($BUILD)
# Both agents at once: one wins the initialize key and bootstraps, the other waits for
# it and clones it (pg_basebackup, fast checkpoint).
start_agent 1
start_agent 2
[ -z "$ASYNC" ] || STANDBY_ROLE=replica
wait_for 90 healthy || die "the cluster did not come up: $(cluster)"
log "cluster up: leader n$(leader), ${STANDBY_ROLE:-synchronous standby} streaming"

wait "$BUILD" || die "build failed: $(cat "$W/build.log")"
log "built"
DSN="host=127.0.0.1,127.0.0.1 port=$P1,$P2 user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=2"
export AIRLOCK_DATABASE_URL="$DSN"
"$W/airlock" migrate >/dev/null 2>&1
# What the database promises must be what it keeps: verify passes the synchronous cluster's
# replication and fails the asynchronous one, naming the setting.
vrc=0
"$W/airlock" verify >"$W/verify" 2>"$W/verify.err" || vrc=$?
if [ -n "$ASYNC" ]; then
	# Patroni may call the replica streaming a moment before the primary lists it in
	# pg_stat_replication (verify then WARNs of a slot waiting for a standby): ask again.
	for _ in $(seq 30); do
		grep -q '^FAIL *replication.*synchronous_standby_names' "$W/verify" && [ "$vrc" -ne 0 ] && break
		sleep 1
		vrc=0
		"$W/airlock" verify >"$W/verify" 2>"$W/verify.err" || vrc=$?
	done
	grep -q '^FAIL *replication.*synchronous_standby_names' "$W/verify" && [ "$vrc" -ne 0 ] ||
		die "airlock verify did not fail asynchronous replication (exit $vrc): $(cat "$W/verify")"
	log "airlock verify (exit $vrc): $(grep -m1 '^FAIL *replication' "$W/verify" | cut -c1-160)…"
	exit 0
fi
for _ in $(seq 30); do # as above: the standby may show in pg_stat_replication a moment later
	grep -q '^PASS *replication' "$W/verify" && break
	sleep 1
	"$W/airlock" verify >"$W/verify" 2>"$W/verify.err" || true
done
grep -q '^PASS *replication' "$W/verify" || die "airlock verify did not pass synchronous replication: $(cat "$W/verify")"
log "airlock verify: $(grep -m1 '^PASS *replication' "$W/verify")"
KEY=$("$W/airlock" apikey create --name drill --scope runs,read,operator 2>/dev/null)
AIRLOCK_USER_PASSWORD=drill-lead-pw "$W/airlock" user add drill-lead --role lead >/dev/null 2>&1

# The provider comes up first: its address goes into the policy file.
"$W/failover-load" -dir "$W" -urls "http://127.0.0.1:$H1,http://127.0.0.1:$H2" -key "$KEY" \
	-approver drill-lead -password drill-lead-pw -dsn "$DSN" -workers "$WORKERS" -settle "$SETTLE" >"$W/report" 2>"$W/load.err" &
LOADPID=$!
PIDS+=($LOADPID)
wait_for 60 test -s "$W/provider.addr" || die "failover-load did not start: $(cat "$W/load.err")"
PROV=http://$(cat "$W/provider.addr")
cat >"$W/policy.yaml" <<Y
actions:
  note:
    connector: http
    gate: none
    http: {url: $PROV/note, timeout: 3s, lookup_url: "$PROV/note?key={effect_id}", lookup_authoritative: true}
    settle_window: 5s   # its provider answers at once: a "none" 5 s after the send is proof
  gated:
    connector: http
    gate: approve_before_act
    http: {url: $PROV/gated, timeout: 3s}   # no lookup: an unknown one waits for an operator
    approvers: {roles: [lead]}
    approval_ttl: 1h
dispatch: {interval: 2s, lease: 6s, reconcile_interval: 1s, drain: 2s}
Y
export AIRLOCK_CONFIG="$W/policy.yaml"
for i in 1 2; do
	eval port=\$H$i
	AIRLOCK_LISTEN=127.0.0.1:$port "$W/airlock" serve >"$W/airlock$i.log" 2>&1 &
	PIDS+=($!)
done
wait_for 60 curl -sf "http://127.0.0.1:$H1/readyz" -o /dev/null || die "airlock 1 not ready"
wait_for 60 curl -sf "http://127.0.0.1:$H2/readyz" -o /dev/null || die "airlock 2 not ready"
log "airlock up on :$H1 and :$H2; load running ($WORKERS workers)"

sleep "$PAUSE"
for r in $(seq 1 "$ROUNDS"); do
	n=$(leader)
	[ -n "$n" ] || die "no leader before round $r"
	pm=$(head -n1 "$W/pg$n/postmaster.pid")
	kill_ms=$(date +%s%3N)
	kill -9 "${AGENT[$n]}" "$pm"
	wait "${AGENT[$n]}" 2>/dev/null || true
	log "round $r: SIGKILL n$n (postmaster $pm and its Patroni agent)"
	other=$((3 - n))
	wait_for 120 is_leader "$other" || die "round $r: n$other was not promoted: $(cluster)"
	prom_ms=$(date +%s%3N)
	echo "$r $kill_ms n$n $prom_ms" >>"$W/kills"
	log "round $r: n$other promoted after $((prom_ms - kill_ms)) ms"
	start_agent "$n"
	wait_for 180 healthy || die "round $r: n$n did not rejoin: $(cluster)"
	log "round $r: n$n rejoined as the synchronous standby"
	sleep "$PAUSE"
done
touch "$W/stop"
log "load stopped; settling the outbox"
rc=0
wait "$LOADPID" || rc=$?
cat "$W/report"
[ -s "$W/load.err" ] && head -n 20 "$W/load.err" >&2
echo "rounds: $ROUNDS  workers: $WORKERS  wall time: $((SECONDS - T0)) s"
grep -h '"level":"ERROR"' "$W"/airlock*.log | head -n 5 || true
exit "$rc"
