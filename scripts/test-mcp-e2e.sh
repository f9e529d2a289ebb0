#!/usr/bin/env bash
# End-to-end test of `airlock mcp` (docs/mcp.md): a real airlock server (SQLite), the real
# @modelcontextprotocol/server-filesystem, server-memory and server-everything from npm
# behind the gateway, and an agent on the
# official TypeScript SDK (e2e/mcp/agent.mjs) that crashes and restarts. Needs node + npm
# and the npm registry; without them it skips, except under CI=true, where it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=local
root=$(pwd)

skip() {
	if [ "${CI:-}" = "true" ]; then
		echo "test-mcp-e2e: $* (CI=true: failing instead of skipping)" >&2
		exit 1
	fi
	echo "test-mcp-e2e: SKIPPED: $*" >&2
	exit 0
}
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || skip "node and npm are needed"

work=$(mktemp -d)
server_pid=""
cleanup() {
	if [ -n "$server_pid" ]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

start=$(date +%s)
cp e2e/mcp/package.json e2e/mcp/package-lock.json e2e/mcp/agent.mjs "$work/"
(cd "$work" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || skip "npm ci failed (is the npm registry reachable?)"
# The crash point (AIRLOCK_TEST_CRASH_AT) exists only in a test build.
go build -tags airlock_testhooks -o "$work/airlock" ./cmd/airlock

mkdir -p "$work/files"
cat >"$work/policy.yaml" <<YAML
actions:
  fs_write: {connector: worker, gate: none}
mcp:
  upstreams:
    files:
      command: node
      args: ["$work/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js", "$work/files"]
      tools:
        read_text_file: read
        list_directory: read
        list_allowed_directories: read
        get_file_info: read
        write_file: {effect: fs_write}
YAML

# Behind server-memory and server-everything: replays and call keys, a slow effect the
# client times out, a clean exit's lease, resources and prompts.
cat >"$work/policy2.yaml" <<YAML
actions:
  fs_write: {connector: worker, gate: none}    # the server's policy is this one: every action type of both
  memory_write: {connector: worker, gate: none}
  slow_op: {connector: worker, gate: none}
mcp:
  upstreams:
    memory:
      command: node
      args: ["$work/node_modules/@modelcontextprotocol/server-memory/dist/index.js"]
      env: {MEMORY_FILE_PATH: "$work/memory.jsonl"}
      tools:
        read_graph: read
        search_nodes: read
        open_nodes: read
        create_entities: {effect: memory_write}
        delete_entities: {effect: memory_write}
    everything:
      command: node
      args: ["$work/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]
      tools:
        echo: read
        get-resource-links: read
        trigger-long-running-operation: {effect: slow_op}
YAML

# Accept each catalogue (docs/mcp.md, pinned tool definitions): the agent below runs with
# the pins on, so every real server's definitions must read the same in each spawn.
for pol in "$work/policy.yaml" "$work/policy2.yaml"; do
	before=$("$work/airlock" mcp tools --config "$pol" 2>&1) || { echo "$before" >&2; echo "test-mcp-e2e: airlock mcp tools failed" >&2; exit 1; }
	grep -q 'write_file.*effect (fs_write).*sha256:.*not pinned\|create_entities.*effect (memory_write).*sha256:.*not pinned' <<<"$before" ||
		{ echo "$before" >&2; echo "test-mcp-e2e: airlock mcp tools does not list the classes and digests" >&2; exit 1; }
	"$work/airlock" mcp tools --config "$pol" --accept >/dev/null
	after=$("$work/airlock" mcp tools --config "$pol")
	if grep -q 'CHANGED\|not pinned' <<<"$after" || [ ! -s "$pol.pins.json" ]; then
		echo "$after" >&2; echo "test-mcp-e2e: the accepted catalogue of $pol does not match itself" >&2; exit 1
	fi
done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
db="$work/airlock.db"
"$work/airlock" migrate --database-url "$db" >/dev/null
key=$("$work/airlock" apikey create --database-url "$db" --name agent --scope runs 2>/dev/null)
"$work/airlock" serve --database-url "$db" --config "$work/policy2.yaml" --listen "127.0.0.1:$port" 2>"$work/serve.log" &
server_pid=$!
for _ in $(seq 1 100); do
	curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
	sleep 0.1
done
curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { cat "$work/serve.log" >&2; echo "test-mcp-e2e: airlock did not start" >&2; exit 1; }

(cd "$work" && AIRLOCK_BIN="$work/airlock" MCP_POLICY="$work/policy.yaml" MCP_POLICY2="$work/policy2.yaml" FILES_DIR="$work/files" AIRLOCK_DB="$db" \
	AIRLOCK_URL="http://127.0.0.1:$port" AIRLOCK_API_KEY="$key" AIRLOCK_LOG_LEVEL=warn MCP_HTTP_PORT="$(free_port)" node agent.mjs) || {
	echo "--- airlock serve log" >&2
	tail -50 "$work/serve.log" >&2
	exit 1
}
echo "test-mcp-e2e: passed in $(($(date +%s) - start))s"
