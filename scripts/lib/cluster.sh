# shellcheck shell=bash
# Sourced by scripts/with-postgres.sh and scripts/with-citus.sh: what starting and stopping
# a throwaway PostgreSQL cluster takes on this machine or a contributor's — the server
# binaries, running them as the postgres user when root (initdb refuses root), a
# temporary directory that user owns, a free loopback port, a clean stop, and the command
# run under it stopped with its whole process tree on a signal.
#
# The sourcing script sets LOG_NAME (its name in messages) first. Globals: BINDIR, AS_ROOT,
# TMP (the cluster directory), CHILD (the command's pid while it runs).
# shellcheck disable=SC2317,SC2013 # on_signal runs from traps

log() { printf '%s: %s\n' "$LOG_NAME" "$*" >&2; }
die() { log "error: $*"; exit 1; }

TMP=""
CHILD=""

# find_bindir prints the PostgreSQL server binaries' directory (pg_config --bindir, else
# the newest /usr/lib/postgresql/*/bin).
find_bindir() {
	local d
	if command -v pg_config >/dev/null 2>&1; then
		d=$(pg_config --bindir 2>/dev/null || true)
		if [ -n "$d" ] && [ -x "$d/initdb" ]; then
			echo "$d"
			return 0
		fi
	fi
	d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
	if [ -n "$d" ] && [ -x "$d/initdb" ]; then
		echo "$d"
		return 0
	fi
	return 1
}

# check_server_user sets AS_ROOT: as root everything runs as the 'postgres' user.
check_server_user() {
	AS_ROOT=0
	if [ "$(id -u)" -eq 0 ]; then
		AS_ROOT=1
		id -u postgres >/dev/null 2>&1 || die "running as root, but there is no 'postgres' user to run the server as"
		command -v runuser >/dev/null 2>&1 || die "running as root, but runuser (util-linux) is missing"
	fi
}

# pg CMD ARGS...: run a PostgreSQL binary as the server user, from inside $TMP
# (so a cwd like /root that the postgres user can't read doesn't matter).
pg() {
	local bin=$1
	shift
	if [ "$AS_ROOT" -eq 1 ]; then
		(cd "$TMP" && runuser -u postgres -- "$BINDIR/$bin" "$@")
	else
		(cd "$TMP" && "$BINDIR/$bin" "$@")
	fi
}

# chown_server PATH...: hand PATH to the server user (when root).
chown_server() { [ "$AS_ROOT" -eq 0 ] || chown postgres: "$@"; }

# make_tmp PREFIX: sets TMP to a new directory the server user can write, with a socket
# directory sock/ in it. Under $TMPDIR when that user can reach it, else /tmp.
make_tmp() {
	TMP=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
	if [ "$AS_ROOT" -eq 1 ]; then
		chown postgres: "$TMP"
		if ! runuser -u postgres -- test -w "$TMP"; then
			rm -rf "$TMP"
			TMP=$(mktemp -d "/tmp/$1.XXXXXX")
			chown postgres: "$TMP"
		fi
	fi
	mkdir "$TMP/sock"
	chown_server "$TMP/sock"
}

# init_cluster DATA: initdb a trusting cluster in DATA, with a UTF-8 C locale when there
# is one (deterministic, independent of $LANG).
init_cluster() {
	local locale_arg=--no-locale
	if locale -a 2>/dev/null | grep -qix 'c\.utf-\{0,1\}8'; then
		locale_arg=--locale=C.UTF-8
	fi
	if ! pg initdb -D "$1" --auth=trust -U postgres -E UTF8 "$locale_arg" --no-sync >"$TMP/initdb.log" 2>&1; then
		cat "$TMP/initdb.log" >&2
		die "initdb failed"
	fi
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pick_port [TAKEN...]: a free loopback port not among TAKEN, below the Linux ephemeral
# range (32768+) so outgoing connections don't take it.
pick_port() {
	local p
	for _ in $(seq 1 50); do
		p=$((15000 + RANDOM % 17000))
		if ! port_in_use "$p" && [[ " $* " != *" $p "* ]]; then
			echo "$p"
			return 0
		fi
	done
	if command -v python3 >/dev/null 2>&1; then
		python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
		return
	fi
	return 1
}

# start_cluster DATA LOG OPTIONS [TAKEN...]: pg_ctl start the cluster in DATA on a free port
# (OPTIONS and -p PORT go to postgres), logging to LOG; tries another port when someone
# took this one between the check and the bind. Sets PORT. On failure the log is kept and
# its tail printed, and it returns 1.
start_cluster() {
	local data=$1 logf=$2 opts=$3 attempt saved
	shift 3
	for attempt in 1 2 3 4 5; do
		PORT=$(pick_port "$@") || die "could not find a free port on 127.0.0.1"
		: >"$logf"
		chown_server "$logf"
		if pg pg_ctl -D "$data" -l "$logf" -w -t 60 -o "$opts -p $PORT" start >/dev/null 2>&1; then
			return 0
		fi
		grep -qiE 'could not bind|address already in use|could not create any TCP/IP sockets' "$logf" || break
		log "port $PORT was taken; retrying (attempt $attempt)"
	done
	saved=$(mktemp "${TMPDIR:-/tmp}/$LOG_NAME-failed.XXXXXX.log")
	cp "$logf" "$saved" 2>/dev/null || true
	log "PostgreSQL in $data did not start (port ${PORT:-?}). Log kept at $saved; last lines:"
	tail -n 40 "$saved" >&2 || true
	return 1
}

# stop_cluster DATA: a fast shutdown, or SIGKILL of the postmaster when that fails.
stop_cluster() {
	local pid
	[ -f "$1/postmaster.pid" ] || return 0
	if ! pg pg_ctl -D "$1" -m fast -w -t 30 stop >/dev/null 2>&1; then
		pid=$(head -n 1 "$1/postmaster.pid" 2>/dev/null || true)
		if [ -n "$pid" ]; then
			log "pg_ctl stop failed; killing postmaster $pid"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
}

# descendants PID: all descendants of PID (Linux /proc; empty elsewhere).
descendants() {
	local c
	for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do
		echo "$c"
		descendants "$c"
	done
}

# on_signal SIG CODE: stop CMD and everything it started, then exit with CODE
# (the EXIT trap then stops the server). The command tree gets SIGINT first,
# like a Ctrl-C (go test then stops its test binaries and cleans up), then
# SIGTERM after 5s, then SIGKILL after 5s more.
on_signal() {
	trap '' INT TERM HUP
	if [ -n "$CHILD" ]; then
		log "got SIG$1; stopping command"
		local pids="" sig
		for sig in INT TERM KILL; do
			pids="$pids $CHILD $(descendants "$CHILD" | tr '\n' ' ')"
			# shellcheck disable=SC2086
			kill -s "$sig" $pids 2>/dev/null || true
			for _ in $(seq 1 50); do
				kill -0 "$CHILD" 2>/dev/null || break 2
				sleep 0.1
			done
		done
		# Whatever of the tree is still around (e.g. background jobs ignoring SIGINT).
		# shellcheck disable=SC2086
		kill -KILL $pids 2>/dev/null || true
		wait "$CHILD" 2>/dev/null || true
	fi
	exit "$2"
}

# trap_signals CLEANUP: run CLEANUP on exit, on_signal on INT, TERM and HUP.
trap_signals() {
	# shellcheck disable=SC2064
	trap "$1" EXIT
	trap 'on_signal INT 130' INT
	trap 'on_signal TERM 143' TERM
	trap 'on_signal HUP 129' HUP
}

# run_command CMD [ARGS...]: run CMD and exit with its exit code. It runs in the
# background and is waited for, so a TERM/INT to this script is handled at once (bash
# defers traps while a foreground command runs); it keeps our stdin and default
# SIGINT/SIGQUIT, which bash ignores for background jobs.
run_command() {
	(
		trap - INT QUIT TERM HUP
		exec "$@"
	) <&0 &
	CHILD=$!
	local rc=0
	wait "$CHILD" || rc=$?
	CHILD=""
	exit "$rc"
}
