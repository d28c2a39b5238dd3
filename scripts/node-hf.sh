#!/usr/bin/env bash
# Installs the official HuggingFace tokenizers Node binding (npm
# tokenizers@0.23.2) into a git-ignored cache and prints its directory.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="testdata/tokenizers/models/.hf-node"
mkdir -p "$dir"
if ! node -e "process.exit(require('$PWD/$dir/node_modules/tokenizers/package.json').version === '0.23.2' ? 0 : 1)" 2>/dev/null; then
  [ -f "$dir/package.json" ] || echo '{"private": true}' > "$dir/package.json"
  (cd "$dir" && npm install --silent --no-audit --no-fund tokenizers@0.23.2 >&2)
fi
echo "$PWD/$dir"
