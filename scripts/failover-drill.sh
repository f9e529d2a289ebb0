#!/usr/bin/env bash
# Usage: scripts/failover-drill.sh [ROUNDS] [WORKERS]
#
# The PostgreSQL failover drill (docs/deployment.md#postgresql-failover): etcd and two
# Patroni-managed PostgreSQL 15 nodes on loopback with synchronous replication
# (synchronous_mode_strict), two `airlock serve` instances on a multi-host DSN
# (host=a,b target_session_attrs=read-write), WORKERS clients claiming unique keys through
# the API without pause. Each round SIGKILLs the primary's postmaster and its Patroni
# agent (the node is lost), waits for Patroni to promote the replica, then starts the old
# node's agent again, which rejoins as the synchronous standby (pg_rewind).
# It reports acknowledged claims lost, client-visible statuses, and per round the time
# from the kill to the first acknowledged claim after it. Exits non-zero if an
# acknowledged claim was lost or a client saw a status other than 2xx/503.
# Needs: apt-get install -y patroni etcd-server python3-etcd (and PostgreSQL 15). Root
# or not: the database side runs as the postgres user when run as root.
set -euo pipefail

ROUNDS=${1:-3}
WORKERS=${2:-4}
cd "$(dirname "$0")/.."
log() { printf 'drill: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for b in etcd patroni curl psql; do command -v "$b" >/dev/null || die "$b not found (apt-get install -y patroni etcd-server python3-etcd)"; done
BINDIR=$(printf '%s\n' /usr/lib/postgresql/15/bin | head -n1)
[ -x "$BINDIR/postgres" ] || die "PostgreSQL 15 binaries not found in $BINDIR"

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
	rm -rf "$W"
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

node_yml() { # node port rest
	cat >"$W/n$1.yml" <<Y
scope: drill
name: n$1
restapi: {listen: 127.0.0.1:$3, connect_address: 127.0.0.1:$3}
etcd: {host: 127.0.0.1:$EC}
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    synchronous_mode: true
    synchronous_mode_strict: true
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
start_agent 1
sleep 3
start_agent 2

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
sys.exit(0 if r==[("leader","running"),("sync_standby","running")] or r==[("leader","running"),("sync_standby","streaming")] else 1)'; }
is_leader() { [ "$(leader)" = "$1" ]; }
wait_for() { # seconds cmd...
	local until=$((SECONDS + $1)); shift
	until "$@"; do [ $SECONDS -lt $until ] || return 1; sleep 0.5; done
}
wait_for 90 healthy || die "the cluster did not come up: $(cluster)"
log "cluster up: leader n$(leader), synchronous standby streaming"

GOTOOLCHAIN=local go build -o "$W/airlock" ./cmd/airlock
DSN="host=127.0.0.1,127.0.0.1 port=$P1,$P2 user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=2"
export AIRLOCK_DATABASE_URL="$DSN"
"$W/airlock" migrate >/dev/null 2>&1
KEY=$("$W/airlock" apikey create --name drill --scope runs 2>/dev/null)
for i in 1 2; do
	eval port=\$H$i
	AIRLOCK_LISTEN=127.0.0.1:$port "$W/airlock" serve >"$W/airlock$i.log" 2>&1 &
	PIDS+=($!)
done
wait_for 60 curl -sf "http://127.0.0.1:$H1/readyz" -o /dev/null || die "airlock 1 not ready"
wait_for 60 curl -sf "http://127.0.0.1:$H2/readyz" -o /dev/null || die "airlock 2 not ready"

# load: each worker claims fresh keys, alternating instances, and logs "ms key status".
load() { # worker
	local i=0 port
	while [ ! -f "$W/stop" ]; do
		i=$((i + 1))
		if [ $((i % 2)) -eq 0 ]; then port=$H1; else port=$H2; fi
		k="drill-$1-$i"
		code=$(curl -s -o /dev/null -w '%{http_code}' -m 10 -H "Authorization: Bearer $KEY" \
			-H 'Content-Type: application/json' -d "{\"key\":\"$k\",\"payload\":{\"n\":$i}}" \
			"http://127.0.0.1:$port/v1/runs/claim" || true)
		echo "$(date +%s%3N) $k $code" >>"$W/load$1.log"
	done
}
LOADERS=()
for w in $(seq 1 "$WORKERS"); do load "$w" & LOADERS+=($!); PIDS+=($!); done

sleep 5
for r in $(seq 1 "$ROUNDS"); do
	n=$(leader)
	[ -n "$n" ] || die "no leader before round $r"
	pm=$(head -n1 "$W/pg$n/postmaster.pid")
	kill_ms=$(date +%s%3N)
	kill -9 "${AGENT[$n]}" "$pm"
	wait "${AGENT[$n]}" 2>/dev/null || true
	echo "$r $kill_ms n$n" >>"$W/kills"
	log "round $r: SIGKILL n$n (postmaster $pm and its Patroni agent)"
	other=$((3 - n))
	wait_for 120 is_leader "$other" || die "round $r: n$other was not promoted: $(cluster)"
	log "round $r: n$other promoted after $(( $(date +%s%3N) - kill_ms )) ms"
	start_agent "$n"
	wait_for 180 healthy || die "round $r: n$n did not rejoin: $(cluster)"
	log "round $r: n$n rejoined as the synchronous standby"
	sleep 5
done
touch "$W/stop"
wait "${LOADERS[@]}" || true

cat "$W"/load*.log | sort -n >"$W/all.log"
awk '$3 ~ /^2/ {print $2}' "$W/all.log" >"$W/acked"
acked=$(wc -l <"$W/acked")
p=$([ "$(leader)" = 1 ] && echo "$P1" || echo "$P2")
psql -h 127.0.0.1 -p "$p" -U postgres -d postgres -Atc "SELECT idempotency_key FROM workflow_runs WHERE idempotency_key LIKE 'drill-%'" | sort >"$W/stored"
lost=$(sort "$W/acked" | comm -23 - "$W/stored" | wc -l)
echo "rounds: $ROUNDS  workers: $WORKERS  requests: $(wc -l <"$W/all.log")  acknowledged claims: $acked"
echo "acknowledged claims lost: $lost"
echo "statuses seen by clients: $(awk '{print $3}' "$W/all.log" | sort | uniq -c | awk '{printf "%s×%s ", $2, $1}')"
while read -r r kill_ms node; do
	# writes are out from the kill until the first acknowledged claim after the first refused one
	back=$(awk -v t="$kill_ms" '$1 > t && $3 !~ /^2/ {e=1} e && $3 ~ /^2/ {print $1; exit}' "$W/all.log")
	refused=$(awk -v t="$kill_ms" -v b="${back:-0}" '$1 > t && $1 <= b && $3 !~ /^2/' "$W/all.log" | wc -l)
	echo "round $r ($node killed): writes back after $(( ${back:-$kill_ms} - kill_ms )) ms; $refused claims refused meanwhile"
done <"$W/kills"
bad=$(awk '$3 !~ /^(2|503)/' "$W/all.log" | wc -l)
echo "statuses other than 2xx and 503: $bad"
grep -h '"level":"ERROR"' "$W"/airlock*.log | head -n 5 || true
[ "$lost" -eq 0 ] && [ "$bad" -eq 0 ]
