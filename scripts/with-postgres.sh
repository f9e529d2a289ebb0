#!/usr/bin/env bash
# Usage: scripts/with-postgres.sh CMD [ARGS...]
#
# Starts a throwaway PostgreSQL cluster on a free 127.0.0.1 port, runs CMD with
#   AIRLOCK_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable
#   AIRLOCK_TEST_PG_RESTART=<command that restarts the cluster; append fast|immediate>
# exported, then stops the cluster and removes its files. Exits with CMD's exit code.
# If AIRLOCK_TEST_DATABASE_URL is already set, CMD runs against that server instead.
# shellcheck disable=SC2317,SC2013 # cleanup/on_signal run from traps
set -euo pipefail

log() { printf 'with-postgres: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$#" -gt 0 ] || die "usage: $0 CMD [ARGS...]"

if [ -n "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec "$@"
fi

# --- locate PostgreSQL server binaries --------------------------------------
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

install_postgres() {
	command -v apt-get >/dev/null 2>&1 ||
		die "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found and apt-get is unavailable; install them, or set AIRLOCK_TEST_DATABASE_URL"
	local -a sudo=()
	if [ "$(id -u)" -ne 0 ]; then
		command -v sudo >/dev/null 2>&1 ||
			die "PostgreSQL server binaries not found; install the 'postgresql' package (needs root)"
		sudo=(sudo)
	fi
	log "PostgreSQL server binaries not found; installing package 'postgresql'"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql ||
		{ "${sudo[@]}" apt-get update && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; } ||
		die "apt-get install postgresql failed"
}

if ! BINDIR=$(find_bindir); then
	install_postgres
	BINDIR=$(find_bindir) || die "PostgreSQL installed, but no initdb found via pg_config --bindir or /usr/lib/postgresql/*/bin"
fi

# --- who runs the server ----------------------------------------------------
# initdb refuses to run as root, so as root everything runs as the 'postgres' user.
AS_ROOT=0
if [ "$(id -u)" -eq 0 ]; then
	AS_ROOT=1
	id -u postgres >/dev/null 2>&1 || die "running as root, but there is no 'postgres' user to run the server as"
	command -v runuser >/dev/null 2>&1 || die "running as root, but runuser (util-linux) is missing"
fi

TMP=""
PORT=""
CHILD=""
CLEANED=0

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

cleanup() {
	local rc=$?
	[ "$CLEANED" -eq 0 ] || return 0
	CLEANED=1
	trap '' INT TERM HUP
	if [ -n "$TMP" ] && [ -d "$TMP" ]; then
		if [ -f "$TMP/data/postmaster.pid" ]; then
			log "stopping PostgreSQL on 127.0.0.1:$PORT and removing $TMP"
			if ! pg pg_ctl -D "$TMP/data" -m fast -w -t 30 stop >/dev/null 2>&1; then
				local pid
				pid=$(head -n 1 "$TMP/data/postmaster.pid" 2>/dev/null || true)
				if [ -n "$pid" ]; then
					log "pg_ctl stop failed; killing postmaster $pid"
					kill -KILL "$pid" 2>/dev/null || true
				fi
			fi
		fi
		rm -rf "$TMP"
	fi
	exit "$rc"
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

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

# --- create the cluster -----------------------------------------------------
TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-pg.XXXXXX")
if [ "$AS_ROOT" -eq 1 ]; then
	chown postgres: "$TMP"
	if ! runuser -u postgres -- test -w "$TMP"; then
		# $TMPDIR is not reachable by the postgres user: fall back to /tmp.
		rm -rf "$TMP"
		TMP=$(mktemp -d /tmp/airlock-pg.XXXXXX)
		chown postgres: "$TMP"
	fi
fi
mkdir "$TMP/sock"
[ "$AS_ROOT" -eq 0 ] || chown postgres: "$TMP/sock"
SERVER_LOG="$TMP/server.log"

# Prefer a UTF-8 C locale when available: deterministic, independent of $LANG.
LOCALE_ARG=--no-locale
if locale -a 2>/dev/null | grep -qix 'c\.utf-\{0,1\}8'; then
	LOCALE_ARG=--locale=C.UTF-8
fi

log "creating a throwaway PostgreSQL cluster in $TMP (initdb: a few seconds)"
if ! pg initdb -D "$TMP/data" --auth=trust -U postgres -E UTF8 "$LOCALE_ARG" --no-sync >"$TMP/initdb.log" 2>&1; then
	cat "$TMP/initdb.log" >&2
	die "initdb failed"
fi

# --- pick a free port and start ---------------------------------------------
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_port() {
	local p
	# Stay below the Linux ephemeral range (32768+) so outgoing connections don't take it.
	for _ in $(seq 1 50); do
		p=$((15000 + RANDOM % 17000))
		if ! port_in_use "$p"; then
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

started=0
for attempt in 1 2 3 4 5; do
	PORT=$(pick_port) || die "could not find a free port on 127.0.0.1"
	log "starting it on 127.0.0.1:$PORT"
	: >"$SERVER_LOG"
	[ "$AS_ROOT" -eq 0 ] || chown postgres: "$SERVER_LOG"
	if pg pg_ctl -D "$TMP/data" -l "$SERVER_LOG" -w -t 60 \
		-o "-c listen_addresses=127.0.0.1 -p $PORT -k '$TMP/sock' -c max_connections=300" \
		start >/dev/null 2>&1; then
		started=1
		break
	fi
	# Someone grabbed the port between the check and the bind: try another one.
	grep -qiE 'could not bind|address already in use|could not create any TCP/IP sockets' "$SERVER_LOG" || break
	log "port $PORT was taken; retrying (attempt $attempt)"
done

if [ "$started" -eq 1 ]; then
	for _ in $(seq 1 100); do
		if "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PORT" -U postgres -d postgres; then
			started=2
			break
		fi
		sleep 0.1
	done
fi

if [ "$started" -ne 2 ]; then
	saved=$(mktemp "${TMPDIR:-/tmp}/airlock-pg-failed.XXXXXX.log")
	cp "$SERVER_LOG" "$saved" 2>/dev/null || true
	log "PostgreSQL did not start (port ${PORT:-?}). Server log kept at $saved; last lines:"
	tail -n 40 "$saved" >&2 || true
	exit 1
fi

export AIRLOCK_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PORT/postgres?sslmode=disable"
# A command that restarts this cluster: append the shutdown mode (fast | immediate). The
# soak (scripts/soak.sh) uses it to restart PostgreSQL under load.
PG_CTL="$BINDIR/pg_ctl"
[ "$AS_ROOT" -eq 0 ] || PG_CTL="runuser -u postgres -- $BINDIR/pg_ctl"
export AIRLOCK_TEST_PG_RESTART="cd '$TMP' && $PG_CTL -D '$TMP/data' -l '$SERVER_LOG' -w -t 60 restart -m"
log "$("$BINDIR/postgres" --version) ready on 127.0.0.1:$PORT (data in $TMP)"

# --- run the command --------------------------------------------------------
# Run CMD in the background and wait, so a TERM/INT to this script is handled
# at once (bash defers traps while a foreground command runs). Keep our stdin
# and restore default SIGINT/SIGQUIT, which bash ignores for background jobs.
(
	trap - INT QUIT TERM HUP
	exec "$@"
) <&0 &
CHILD=$!
rc=0
wait "$CHILD" || rc=$?
CHILD=""
exit "$rc"
