#!/usr/bin/env bash
# make e2e-client: the official OpenAI Node SDK (npm package openai, pinned)
# against `prefixrouter serve` in front of `prefixrouter sim` pods, on
# loopback. Starts everything it needs and stops it on exit.
set -euo pipefail
OPENAI_VERSION=7.55.0
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/bin/prefixrouter"
cache="${E2E_CLIENT_CACHE:-$root/bin/e2e-client}"
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

command -v node >/dev/null || { echo "e2e-client: node is required" >&2; exit 1; }
if [ ! -f "$cache/node_modules/openai/package.json" ] ||
   ! grep -q "\"version\": \"$OPENAI_VERSION\"" "$cache/node_modules/openai/package.json"; then
  mkdir -p "$cache"
  npm install --prefix "$cache" --no-audit --no-fund --silent "openai@$OPENAI_VERSION"
fi

"$bin" sim --pods 2 --profile tiny --listen 127.0.0.1:0 --events-port 0 --log-level warn >"$work/endpoints" 2>"$work/sim.log" &
pids+=($!)
for _ in $(seq 100); do [ "$(wc -l <"$work/endpoints")" -ge 2 ] && break; sleep 0.1; done
[ "$(wc -l <"$work/endpoints")" -ge 2 ] || { echo "e2e-client: simulator did not start" >&2; cat "$work/sim.log" >&2; exit 1; }
args=()
while read -r ep; do args+=(--endpoint "$ep"); done <"$work/endpoints"

"$bin" serve --listen 127.0.0.1:0 --admin-listen "" --tokenizer sim-tiny=bytes "${args[@]}" 2>"$work/serve.log" &
pids+=($!)
addr=""
for _ in $(seq 100); do
  addr="$(grep -o 'msg="router listening" addr=[0-9.:]*' "$work/serve.log" | head -1 | sed 's/.*addr=//')" || true
  [ -n "$addr" ] && curl -sf "http://$addr/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://$addr/ready" >/dev/null || { echo "e2e-client: router not ready" >&2; cat "$work/serve.log" >&2; exit 1; }

cp "$root/scripts/e2e-client.mjs" "$cache/e2e-client.mjs"
node "$cache/e2e-client.mjs" "http://$addr/v1" sim-tiny
