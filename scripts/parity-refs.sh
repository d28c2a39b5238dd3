#!/usr/bin/env bash
# Regenerates the reference ids in testdata/tokenizers/ref from the fetched
# tokenizer.json files with HuggingFace's own tokenizers (npm 0.23.2).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-tokenizers.sh
nodedir="$(./scripts/node-hf.sh)"
NODE_PATH="$nodedir/node_modules" node scripts/parity-refs.js "$PWD" qwen3 llama3_1 deepseek_v3
