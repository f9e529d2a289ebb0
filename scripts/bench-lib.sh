# Shell helpers the PostgreSQL benchmarks share (sourced by bench-outbox.sh and
# bench-cpu.sh, which define log and set BENCH_TMP, ADMIN_URL, RUN_ID, POOL and ONLY).

die() {
	log "error: $*"
	exit 1
}

free_port() {
	python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null && return
	local p
	for _ in $(seq 1 50); do
		p=$((20000 + RANDOM % 12000))
		(exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || {
			echo "$p"
			return
		}
	done
	return 1
}

# wait_ready PORT PID LOG: until GET /readyz answers 200, or the process died.
wait_ready() {
	local i
	for i in $(seq 1 300); do
		if curl -fsS -o /dev/null "http://127.0.0.1:$1/readyz" 2>/dev/null; then
			return 0
		fi
		kill -0 "$2" 2>/dev/null || {
			tail -n 20 "$3" >&2
			die "airlock on port $1 exited"
		}
		[ "$i" -lt 300 ] || break
		sleep 0.1
	done
	die "airlock on port $1 not ready after 30s"
}

# stop_instances: SIGTERM every airlock we started, SIGKILL what is left after 15 s.
stop_instances() {
	local pid pids
	pids=$(cat "$BENCH_TMP/pids" 2>/dev/null || true)
	[ -n "$pids" ] || return 0
	for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
	for _ in $(seq 1 150); do
		local alive=0
		for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
		[ "$alive" -eq 1 ] || break
		sleep 0.1
	done
	for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
	: >"$BENCH_TMP/pids"
}

# drop_bench_dbs drops every database newdb created.
drop_bench_dbs() {
	local db
	for db in $(cat "$BENCH_TMP/dbs" 2>/dev/null || true); do
		psql "$ADMIN_URL" -qAtX -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	done
}

# dburl DB [PARAMS]: ADMIN_URL with its database replaced by DB, its query parameters
# kept and PARAMS ("k=v&…") added.
dburl() {
	local base=${ADMIN_URL%%\?*} query=""
	[ "$base" = "$ADMIN_URL" ] || query=${ADMIN_URL#*\?}
	query=${query:+$query${2:+&}}${2:-}
	echo "${base%/*}/$1${query:+?$query}"
}

# newdb NAME [POOL]: create database NAME and print its URL (pool_max_conns=POOL).
newdb() {
	local name="${RUN_ID}_$1"
	psql "$ADMIN_URL" -qAtX -v ON_ERROR_STOP=1 -c "CREATE DATABASE $name" >/dev/null
	echo "$name" >>"$BENCH_TMP/dbs"
	dburl "$name" "pool_max_conns=${2:-$POOL}"
}

dropdb_() {
	psql "$ADMIN_URL" -qAtX -c "DROP DATABASE IF EXISTS ${RUN_ID}_$1 WITH (FORCE)" >/dev/null 2>&1 || true
}

want() { [[ $1 =~ $ONLY ]]; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (a=="" || b=="" || b+0==0) print "n/a"; else printf "%.2f", a/b }'; }
verdict() { awk -v v="$1" -v t="$3" -v op="$2" 'BEGIN{ if (v=="n/a" || v=="") { print "n/a"; exit } ok = (op==">=") ? (v+0 >= t+0) : (v+0 <= t+0); print ok ? "met" : "NOT met" }'; }

# start_instance NAME PORT POLICY DBURL: airlock serve ($AIRLOCK) in the background; its pid
# is appended to $BENCH_TMP/pids (stopped by stop_instances) and written to $BENCH_TMP/NAME.pid.
start_instance() {
	"$AIRLOCK" serve --listen "127.0.0.1:$2" --config "$3" --database-url "$4" \
		--log-level warn --migrate=false >"$BENCH_TMP/$1.log" 2>&1 </dev/null &
	local pid=$!
	echo "$pid" >>"$BENCH_TMP/pids"
	echo "$pid" >"$BENCH_TMP/$1.pid"
	wait_ready "$2" "$pid" "$BENCH_TMP/$1.log"
}
