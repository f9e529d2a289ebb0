#!/usr/bin/env bash
# The n8n community node's tests (integrations/n8n): install its dependencies if they are
# missing, build it with tsc, and run node's test runner against a real airlock that the
# tests build and start. Needs Node 20+ and Go.
set -euo pipefail
cd "$(dirname "$0")/../integrations/n8n"
export GOTOOLCHAIN=local
if [ ! -d node_modules ]; then
	# --ignore-scripts: a lint plugin's preinstall runs `npx only-allow pnpm`; nothing the
	# build and tests use has an install script.
	npm ci --ignore-scripts --no-audit --no-fund
fi
npx tsc
node scripts/copy-static.mjs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# n8n's community-node lint (`npm run lint`, a step of docs/n8n.md) in its strict mode:
# the default eslint config and n8n's rules (the peer range "*", option order, defaults).
npx n8n-node lint >"$tmp/lint.log" 2>&1 ||
	{ sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g' "$tmp/lint.log" | tr '\r' '\n' | grep -v '^\s*$\|Linting' >&2; echo "test-n8n-node: n8n-node lint failed" >&2; exit 1; }
echo "test-n8n-node: n8n-node lint passes"
# n8n's manual install (`npm install <tarball>` in ~/.n8n/nodes) must add nothing but the
# package: its n8n-workflow peer is optional (n8n provides it), so no registry, no
# native build (issue 24, 3).
npm pack --silent --pack-destination "$tmp" >/dev/null
mkdir -p "$tmp/nodes"
(cd "$tmp/nodes" && npm install --offline --no-audit --no-fund "$tmp"/n8n-nodes-airlock-*.tgz >"$tmp/install.log" 2>&1) ||
	{ cat "$tmp/install.log" >&2; echo "test-n8n-node: npm install of the tarball failed" >&2; exit 1; }
extra=$(ls "$tmp/nodes/node_modules" | grep -vx n8n-nodes-airlock || true)
[ -z "$extra" ] || { echo "test-n8n-node: npm install of the tarball also installed: $extra" >&2; exit 1; }
[ -f "$tmp/nodes/node_modules/n8n-nodes-airlock/dist/nodes/Airlock/Airlock.node.js" ] ||
	{ echo "test-n8n-node: the installed package has no dist/nodes/Airlock/Airlock.node.js" >&2; exit 1; }
echo "test-n8n-node: npm install <tarball> adds only n8n-nodes-airlock"
node --test test/*.test.mjs
