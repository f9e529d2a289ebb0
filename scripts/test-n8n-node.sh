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
exec node --test test/*.test.mjs
