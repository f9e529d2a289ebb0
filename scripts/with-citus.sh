#!/usr/bin/env bash
# Usage: scripts/with-citus.sh CMD [ARGS...]
#
# The sibling of scripts/with-postgres.sh for Citus: starts a throwaway Citus cluster — a
# coordinator and two workers, each a PostgreSQL on a free 127.0.0.1 port in one temp
# directory — registers the workers, runs CMD with
#   AIRLOCK_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:COORDINATOR/postgres?sslmode=disable
#   AIRLOCK_TEST_CITUS=1
#   AIRLOCK_TEST_CITUS_WORKERS="PORT1 PORT2"
#   AIRLOCK_TEST_CITUS_CTL=<command: append "stop|start N" to stop or start worker N (1, 2)>
# exported, then stops every node and removes the files. Exits with CMD's exit code.
#
# Citus is built once from a source tarball and cached (no Debian package offers it):
#   CITUS_SRC    the tarball; default ../shared/vendor/citus-13.2.2.tar.gz beside the
#                repository when present, else the v$CITUS_VERSION release from GitHub
#   CITUS_PATCH  a patch applied with -p1 before building; default the
#                citus-*-debian-pg15.patch beside the tarball when present (Debian's
#                PostgreSQL 15.20 headers clash with Citus 13.2.2 on have_createdb_privilege)
#   CITUS_CACHE  the cache directory; default ${XDG_CACHE_HOME:-$HOME/.cache}/airlock-citus
#   CITUS_SHARD_COUNT  shards per distributed table (citus.shard_count); default 32, Citus's
#                own. Every test migrates a schema of its own, whose placement creates
#                12 × this many shards (internal/effects here: 1,185 s at 32, 418 s at 4,
#                at similar loads).
# The build (about 12 minutes on two busy cores) installs into a DESTDIR staging tree under
# CITUS_CACHE, keyed by the tarball's and the patch's hashes and pg_config's version; a later
# run copies that tree into PostgreSQL's directories when citus.so is missing or differs.
# The build dependencies are installed with apt-get when missing (needs root or sudo).
# With CI=true every failure to build or start Citus is an error (exit 1), as it is anyway.
# The nodes' start and stop are scripts/lib/cluster.sh's, shared with with-postgres.sh.
# shellcheck disable=SC2317 # cleanup runs from a trap
set -euo pipefail

LOG_NAME=with-citus
# shellcheck source=scripts/lib/cluster.sh
. "$(dirname "$0")/lib/cluster.sh"

[ "$#" -gt 0 ] || die "usage: $0 CMD [ARGS...]"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CITUS_VERSION=${CITUS_VERSION:-13.2.2}
if [ -z "${CITUS_SRC:-}" ]; then
	for d in "$ROOT/../shared/vendor" "$ROOT/../../shared/vendor"; do
		if [ -f "$d/citus-$CITUS_VERSION.tar.gz" ]; then
			CITUS_SRC=$d/citus-$CITUS_VERSION.tar.gz
			break
		fi
	done
fi
if [ -z "${CITUS_PATCH+set}" ] && [ -n "${CITUS_SRC:-}" ]; then
	p="${CITUS_SRC%.tar.gz}-debian-pg15.patch"
	[ -f "$p" ] && CITUS_PATCH=$p
fi
CITUS_PATCH=${CITUS_PATCH:-}
CITUS_CACHE=${CITUS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airlock-citus}

SUDO=()
[ "$(id -u)" -eq 0 ] || SUDO=(sudo)

BUILD_DEPS=(postgresql-server-dev-15 libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev
	libssl-dev libselinux1-dev libxslt1-dev libpam0g-dev libreadline-dev libicu-dev make gcc)

install_deps() {
	local missing=() p
	for p in "${BUILD_DEPS[@]}"; do
		dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
	done
	[ "${#missing[@]}" -eq 0 ] && return 0
	command -v apt-get >/dev/null 2>&1 || die "missing build dependencies (${missing[*]}) and no apt-get"
	log "installing Citus build dependencies: ${missing[*]}"
	"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2 ||
		{ "${SUDO[@]}" apt-get update -q >&2 && "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >&2; } ||
		die "apt-get install ${missing[*]} failed"
}

# --- build (once) and install Citus ------------------------------------------
install_deps
PG_CONFIG=$(command -v pg_config) || die "pg_config not found (postgresql-server-dev-15)"
PKGLIBDIR=$("$PG_CONFIG" --pkglibdir)
BINDIR=$("$PG_CONFIG" --bindir)
[ -x "$BINDIR/initdb" ] || BINDIR=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
[ -x "$BINDIR/initdb" ] || die "no initdb (install the postgresql package)"

if [ -z "${CITUS_SRC:-}" ]; then
	mkdir -p "$CITUS_CACHE"
	CITUS_SRC=$CITUS_CACHE/citus-$CITUS_VERSION.tar.gz
	if [ ! -f "$CITUS_SRC" ]; then
		log "downloading Citus $CITUS_VERSION"
		curl -fsSL -o "$CITUS_SRC.part" "https://github.com/citusdata/citus/archive/refs/tags/v$CITUS_VERSION.tar.gz" ||
			die "could not download Citus $CITUS_VERSION (set CITUS_SRC to a tarball)"
		mv "$CITUS_SRC.part" "$CITUS_SRC"
	fi
fi
[ -f "$CITUS_SRC" ] || die "CITUS_SRC=$CITUS_SRC: no such file"
[ -z "$CITUS_PATCH" ] || [ -f "$CITUS_PATCH" ] || die "CITUS_PATCH=$CITUS_PATCH: no such file"

KEY=$( (sha256sum "$CITUS_SRC" ${CITUS_PATCH:+"$CITUS_PATCH"} | cut -c1-64; "$PG_CONFIG" --version) | sha256sum | cut -c1-16)
BUILD=$CITUS_CACHE/$KEY
mkdir -p "$CITUS_CACHE"
(
	# One build at a time per cache: a second run waits for the first one's result.
	flock 9
	[ -d "$BUILD/stage" ] && exit 0
	log "building Citus from $CITUS_SRC into $BUILD (once; about 12 minutes on two cores)"
	rm -rf "$BUILD.tmp"
	mkdir -p "$BUILD.tmp/src"
	tar -xzf "$CITUS_SRC" -C "$BUILD.tmp/src" --strip-components=1
	cd "$BUILD.tmp/src"
	[ -z "$CITUS_PATCH" ] || patch -s -p1 <"$CITUS_PATCH"
	{ ./configure PG_CONFIG="$PG_CONFIG" && nice make -j"$(nproc)" && make install DESTDIR="$BUILD.tmp/stage"; } >"$BUILD.tmp/build.log" 2>&1 || {
		tail -n 40 "$BUILD.tmp/build.log" >&2
		die "building Citus failed (log: $BUILD.tmp/build.log)"
	}
	cd /
	rm -rf "$BUILD.tmp/src"
	mv "$BUILD.tmp" "$BUILD"
) 9>"$CITUS_CACHE/.lock" || exit 1
STAGED_SO=$BUILD/stage$PKGLIBDIR/citus.so
[ -f "$STAGED_SO" ] || die "the cached build $BUILD has no $PKGLIBDIR/citus.so (remove $BUILD to rebuild)"
if ! cmp -s "$STAGED_SO" "$PKGLIBDIR/citus.so"; then
	log "installing Citus into $PKGLIBDIR and $("$PG_CONFIG" --sharedir)/extension"
	"${SUDO[@]}" cp -a "$BUILD/stage/." / || die "could not copy $BUILD/stage into /"
fi

if [ -n "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec "$@"
fi

check_server_user

CLEANED=0
NODES=(c w1 w2)
declare -A PORTS=()

cleanup() {
	local rc=$?
	[ "$CLEANED" -eq 0 ] || return 0
	CLEANED=1
	trap '' INT TERM HUP
	if [ -n "$TMP" ] && [ -d "$TMP" ]; then
		log "stopping the Citus nodes and removing $TMP"
		local n
		for n in "${NODES[@]}"; do stop_cluster "$TMP/$n"; done
		rm -rf "$TMP"
	fi
	exit "$rc"
}
trap_signals cleanup

make_tmp airlock-citus
log "creating a coordinator and two workers in $TMP"
init_cluster "$TMP/c"
# Citus: preloaded; prepared transactions for its two-phase commit across nodes.
cat >>"$TMP/c/postgresql.conf" <<CONF
shared_preload_libraries = 'citus'
max_prepared_transactions = 200
max_connections = 300
listen_addresses = '127.0.0.1'
unix_socket_directories = '$TMP/sock'
fsync = off
citus.shard_count = ${CITUS_SHARD_COUNT:-32}
CONF
for n in w1 w2; do
	cp -a "$TMP/c" "$TMP/$n"
done

start_node() {
	# shellcheck disable=SC2068 # the ports taken so far, one word each
	start_cluster "$TMP/$1" "$TMP/$1.log" "" ${PORTS[@]} || exit 1
	PORTS[$1]=$PORT
}

psql_on() {
	local port=$1
	shift
	"$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres -At "$@"
}

for n in "${NODES[@]}"; do
	start_node "$n"
	psql_on "${PORTS[$n]}" -c 'CREATE EXTENSION citus' >/dev/null || die "CREATE EXTENSION citus failed on $n"
done
psql_on "${PORTS[c]}" -c "SELECT citus_set_coordinator_host('127.0.0.1', ${PORTS[c]})" >/dev/null ||
	die "citus_set_coordinator_host failed"
for n in w1 w2; do
	psql_on "${PORTS[c]}" -c "SELECT citus_add_node('127.0.0.1', ${PORTS[$n]})" >/dev/null || die "citus_add_node($n) failed"
done
workers=$(psql_on "${PORTS[c]}" -c 'SELECT count(*) FROM citus_get_active_worker_nodes()')
[ "$workers" = 2 ] || die "the coordinator sees $workers active workers, not 2"

export AIRLOCK_TEST_DATABASE_URL="postgres://postgres@127.0.0.1:${PORTS[c]}/postgres?sslmode=disable"
export AIRLOCK_TEST_CITUS=1
export AIRLOCK_TEST_CITUS_WORKERS="${PORTS[w1]} ${PORTS[w2]}"
PG_CTL="$BINDIR/pg_ctl"
[ "$AS_ROOT" -eq 0 ] || PG_CTL="runuser -u postgres -- $BINDIR/pg_ctl"
# AIRLOCK_TEST_CITUS_CTL stop N | start N: stop (immediate) or start worker N.
cat >"$TMP/ctl.sh" <<CTL
#!/usr/bin/env bash
set -e
cd '$TMP'
ports=(${PORTS[w1]} ${PORTS[w2]})
case "\$1" in
stop) $PG_CTL -D '$TMP/w'"\$2" -m immediate -w -t 60 stop ;;
start) $PG_CTL -D '$TMP/w'"\$2" -l '$TMP/w'"\$2"'.log' -w -t 60 -o "-p \${ports[\$2-1]}" start ;;
*) echo "usage: \$0 stop|start 1|2" >&2; exit 2 ;;
esac
CTL
chmod +x "$TMP/ctl.sh"
export AIRLOCK_TEST_CITUS_CTL="$TMP/ctl.sh"
log "Citus $(psql_on "${PORTS[c]}" -c "SELECT extversion FROM pg_extension WHERE extname = 'citus'") ready: coordinator 127.0.0.1:${PORTS[c]}, workers ${PORTS[w1]} ${PORTS[w2]} (data in $TMP)"

run_command "$@"
