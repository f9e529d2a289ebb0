#!/usr/bin/env bash
# Usage: bash scripts/bench-chain.sh
#
# The events hash chain's trigger alone (issue 23): PostgreSQL CPU per event inserted
# with the trigger off, with 0015's function and with the function migrations leave in
# place (the last migration that defines events_chain), on one throwaway PostgreSQL
# (scripts/with-postgres.sh, or AIRLOCK_TEST_DATABASE_URL when the cluster runs on this
# machine). pgbench (one client, prepared) inserts a claimed event like a claim's, ten
# single-row INSERTs per transaction, two distributions of run keys: "new" (a new run
# per event: the claim) and "hot" (1000 runs: their heads exist, as for the outbox's
# outcome events). The variants alternate, BENCH_PASSES (3) times; events and heads are
# truncated before each. CPU = the cluster's postmaster, its live children and the
# children it reaped (/proc, clock ticks) before and after, over BENCH_TX (3000)
# transactions; the trigger's share is a variant's figure minus "off" in the same pass.
# Beside it, "loop": the same events inserted by a DO block in one backend (COMMIT every
# ten), that backend's own CPU read from /proc/self/stat before and after (superuser:
# pg_read_file) — no client, protocol or background process in the figure.
#
# Environment: BENCH_PASSES (3), BENCH_TX (3000), AIRLOCK_BIN (the airlock that migrates
# the database; default: this tree's, built).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "${AIRLOCK_TEST_DATABASE_URL:-}" ]; then
	exec bash "$ROOT/scripts/with-postgres.sh" bash "$ROOT/scripts/bench-chain.sh" "$@"
fi
log() { printf 'bench-chain: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}
command -v pgbench >/dev/null || die "pgbench is needed"
[ -r /proc/self/stat ] || die "this benchmark reads CPU times from /proc (Linux)"

PASSES=${BENCH_PASSES:-3}
TX=${BENCH_TX:-3000}
ADMIN_URL=$AIRLOCK_TEST_DATABASE_URL
DB="chain$(date +%s)$RANDOM"
DATADIR=$(psql "$ADMIN_URL" -qAtX -c "SHOW data_directory")
PGPID=$(head -n 1 "$DATADIR/postmaster.pid" 2>/dev/null) || die "cannot read $DATADIR/postmaster.pid (the cluster must run on this machine)"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/airlock-bench-chain.XXXXXX")
cleanup() {
	psql "$ADMIN_URL" -qAtX -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
	rm -rf "$TMP"
}
trap cleanup EXIT

AIRLOCK=${AIRLOCK_BIN:-}
if [ -z "$AIRLOCK" ]; then
	AIRLOCK="$TMP/airlock"
	(cd "$ROOT" && go build -o "$AIRLOCK" ./cmd/airlock)
fi
psql "$ADMIN_URL" -qAtX -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB" >/dev/null
base=${ADMIN_URL%%\?*}
URL="${base%/*}/$DB"
"$AIRLOCK" migrate --database-url "$URL?sslmode=disable" >/dev/null 2>&1 || die "migrate failed"

# function FILE: the CREATE [OR REPLACE] FUNCTION events_chain() statement of a migration.
function_of() {
	awk '/FUNCTION events_chain\(\)/ { on = 1; sub(/^CREATE (OR REPLACE )?/, "CREATE OR REPLACE ") } on { print } on && /^END \$\$;/ { exit }' "$1"
}
MIG="$ROOT/internal/store/postgres/migrations"
function_of "$MIG/0015_chain.sql" >"$TMP/v0015.sql"
LATEST=$(grep -l 'FUNCTION events_chain()' "$MIG"/*.sql | sort | tail -n 1)
function_of "$LATEST" >"$TMP/current.sql"
grep -q 'RETURN NEW' "$TMP/v0015.sql" && grep -q 'RETURN NEW' "$TMP/current.sql" || die "cannot read the trigger functions"

# One transaction: ten events, each of the key distribution's runs. pgbench parses ':x'
# in literals as variables, so the JSON's colons are written \x3a (the E'' literal).
for d in new hot; do
	n=1000000000000
	[ "$d" = hot ] && n=1000
	{
		echo BEGIN
		for i in $(seq 10); do echo "\\set k$i random(1, $n)"; done
		for i in $(seq 10); do
			echo "INSERT INTO events (run_key, at, kind, version, actor, meta, detail) VALUES ('run-' || :k$i, now(), 'claimed', 1, 'key-bench', E'{\"trace_id\"\\x3a\"4bf92f3577b34da6a3ce929d0e0e4736\"}', E'{\"payload_hash\"\\x3a\"sha256\\x3a9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\", \"lease_expires_at\"\\x3a\"2026-12-01T18\\x3a40\\x3a00.123456Z\"}');"
		done
		echo COMMIT
	} >"$TMP/tx_$d.sql"
done

psql "$URL" -qAtX -v ON_ERROR_STOP=1 >/dev/null <<'EOF'
CREATE FUNCTION bench_cpu_ticks() RETURNS bigint LANGUAGE sql AS $f$
  SELECT s[12]::bigint + s[13]::bigint
  FROM (SELECT string_to_array(split_part(pg_read_file('/proc/self/stat'), ') ', 2), ' ') AS s) x
$f$;
EOF
cat >"$TMP/loop.sql" <<'EOF'
DO $$
DECLARE t0 bigint; t1 bigint; k text; hot boolean := current_setting('bench.dist') = 'hot'; n int := current_setting('bench.n')::int;
BEGIN
  t0 := bench_cpu_ticks();
  FOR i IN 1..n LOOP
    k := 'run-' || CASE WHEN hot THEN (random() * 1000)::int ELSE i END;
    INSERT INTO events (run_key, at, kind, version, actor, meta, detail) VALUES (k, now(), 'claimed', 1, 'key-bench',
      '{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}', '{"payload_hash":"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "lease_expires_at":"2026-12-01T18:40:00.123456Z"}');
    IF i % 10 = 0 THEN COMMIT; END IF;
  END LOOP;
  t1 := bench_cpu_ticks();
  RAISE NOTICE 'ticks %', t1 - t0;
END $$;
EOF

# pg_cpu: the cluster's CPU so far, in clock ticks.
pg_cpu() {
	local s=0 t p
	for p in "$PGPID" $(cat /proc/"$PGPID"/task/*/children 2>/dev/null); do
		t=$(awk '{ sub(/^.*\) /, ""); print $12 + $13 + $14 + $15 }' "/proc/$p/stat" 2>/dev/null) || continue
		s=$((s + t))
	done
	echo "$s"
}
children() { wc -w </proc/"$PGPID"/task/"$PGPID"/children; }
IDLE=$(children)
HZ=$(getconf CLK_TCK)

# use VARIANT: install it (off: the trigger disabled).
use() {
	if [ "$1" = off ]; then
		psql "$URL" -qAtX -v ON_ERROR_STOP=1 -c "ALTER TABLE events DISABLE TRIGGER events_chain" >/dev/null
	else
		psql "$URL" -qAtX -v ON_ERROR_STOP=1 -f "$TMP/$1.sql" -c "ALTER TABLE events ENABLE TRIGGER events_chain" >/dev/null
	fi
}

fresh() { psql "$URL" -qAtX -v ON_ERROR_STOP=1 -c "TRUNCATE events, event_chains" -c "CHECKPOINT" >/dev/null; }

# measure DIST: PostgreSQL CPU per event through pgbench, in µs.
measure() {
	fresh
	local a b i
	for i in $(seq 100); do [ "$(children)" -le "$IDLE" ] && break; sleep 0.05; done
	a=$(pg_cpu)
	pgbench -n -M prepared -c 1 -t "$TX" -f "$TMP/tx_$1.sql" "$URL" >"$TMP/out" 2>&1 || {
		cat "$TMP/out" >&2
		die "pgbench failed"
	}
	for i in $(seq 100); do [ "$(children)" -le "$IDLE" ] && break; sleep 0.05; done
	b=$(pg_cpu)
	awk -v a="$a" -v b="$b" -v n=$((TX * 10)) -v hz="$HZ" 'BEGIN { printf "%.1f", (b - a) * 1e6 / hz / n }'
}

# loop DIST: the backend's CPU per event in the DO block, in µs.
loop() {
	fresh
	local t
	t=$(PGOPTIONS="-c bench.dist=$1 -c bench.n=$((TX * 10))" psql "$URL" -qAtX -v ON_ERROR_STOP=1 -f "$TMP/loop.sql" 2>&1 | sed -n 's/.*ticks //p')
	[ -n "$t" ] || die "the loop failed"
	awk -v t="$t" -v n=$((TX * 10)) -v hz="$HZ" 'BEGIN { printf "%.1f", t * 1e6 / hz / n }'
}

echo "== events_chain trigger, PostgreSQL CPU per event (µs): $(date -u '+%Y-%m-%d %H:%M') UTC, $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "   $((TX * 10)) events per cell, 10 INSERTs per transaction; current = $(basename "$LATEST")"
echo "   pgbench: one client, the cluster's CPU; loop: a DO block, its backend's CPU; trigger = variant - off"
printf '   %-4s %-4s %-8s %6s %6s %8s %10s %10s\n' pass keys how off 0015 current "0015 trig" "curr trig"
for pass in $(seq "$PASSES"); do
	for d in new hot; do
		for how in pgbench loop; do
			fn=measure
			[ "$how" = loop ] && fn=loop
			use off
			off=$($fn "$d")
			use v0015
			old=$($fn "$d")
			use current
			cur=$($fn "$d")
			printf '   %-4s %-4s %-8s %6s %6s %8s %10s %10s\n' "$pass" "$d" "$how" "$off" "$old" "$cur" \
				"$(awk -v a="$old" -v b="$off" 'BEGIN { printf "%.1f", a - b }')" "$(awk -v a="$cur" -v b="$off" 'BEGIN { printf "%.1f", a - b }')"
		done
	done
done

# The canonical content and its hash alone, in one statement over 200,000 rows, the
# backend's CPU per row: 0015's expression (airlock_chain_field inlined, so meta::text,
# detail::text and the epoch computed three times each) against each computed once (a
# LATERAL subquery standing for 0024's variables).
PGOPTIONS="-c bench.hz=$HZ" psql "$URL" -qAtX -v ON_ERROR_STOP=1 2>&1 >/dev/null <<'EOF' | sed -n 's/.*NOTICE: *//p'
CREATE TABLE bench_rows AS SELECT i::bigint AS id, 'run-' || i AS run_key, now() AS at, 'claimed'::text AS kind,
  1::bigint AS version, 'key-bench'::text AS actor, '{"trace_id":"4bf92f3577b34da6a3ce929d0e0e4736"}'::jsonb AS meta,
  '{"payload_hash":"sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "lease_expires_at":"2026-12-01T18:40:00.123456Z"}'::jsonb AS detail
  FROM generate_series(1, 200000) i;
DO $$
DECLARE t0 bigint; t1 bigint; t2 bigint; n bigint;
BEGIN
  FOR r IN 1..3 LOOP
    t0 := bench_cpu_ticks();
    SELECT count(*) INTO n FROM bench_rows WHERE encode(sha256(convert_to(airlock_chain_field('')
      || airlock_chain_field(id::text) || airlock_chain_field(run_key)
      || airlock_chain_field((extract(epoch FROM at) * 1000000)::bigint::text) || airlock_chain_field(kind)
      || airlock_chain_field(version::text) || airlock_chain_field(actor) || airlock_chain_field(meta::text)
      || airlock_chain_field(detail::text), 'UTF8')), 'hex') <> '';
    t1 := bench_cpu_ticks();
    SELECT count(*) INTO n FROM bench_rows,
      LATERAL (SELECT (extract(epoch FROM at) * 1000000)::bigint::text AS at_us, meta::text AS m, detail::text AS d OFFSET 0) v
      WHERE encode(sha256(convert_to('0:' || airlock_chain_field(id::text) || airlock_chain_field(run_key)
      || airlock_chain_field(v.at_us) || airlock_chain_field(kind) || airlock_chain_field(version::text)
      || airlock_chain_field(actor) || airlock_chain_field(v.m) || airlock_chain_field(v.d), 'UTF8')), 'hex') <> '';
    t2 := bench_cpu_ticks();
    RAISE NOTICE 'content + hash per row (µs), pass %: 0015 % · once each %', r,
      round((t1 - t0) * 1e6 / current_setting('bench.hz')::numeric / n, 2), round((t2 - t1) * 1e6 / current_setting('bench.hz')::numeric / n, 2);
  END LOOP;
END $$;
EOF
