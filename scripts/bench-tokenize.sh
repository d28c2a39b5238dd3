#!/usr/bin/env bash
# Side-by-side throughput on the parity corpus, one core each: this
# encoder (BenchmarkCorpus, segment cache off) against HuggingFace's Rust
# tokenizers through its npm binding; then the segment-cache speed-up on a
# 20-turn chat. Prints MB/s for both and the ratio (goal: ours >= 1.0x).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/fetch-tokenizers.sh
nodedir="$(./scripts/node-hf.sh)"
pin=""
command -v taskset >/dev/null 2>&1 && pin="taskset -c 0"
models="qwen3 llama3_1 deepseek_v3"
declare -A hf
while read -r m v; do hf[$m]=$v; done < <(NODE_PATH="$nodedir/node_modules" UV_THREADPOOL_SIZE=1 $pin node scripts/bench-tokenize.js "$PWD" $models)
go_out="$(GOMAXPROCS=1 $pin go test -run '^$' -bench 'BenchmarkCorpus' -benchtime 3s ./tokenize/bpe/)"
printf '%-12s %10s %10s %7s\n' model "go MB/s" "hf MB/s" ratio
for m in $models; do
  g="$(awk -v m="BenchmarkCorpus/$m" '$1 ~ "^"m"(-[0-9]+)?$" {for (i=1;i<=NF;i++) if ($(i+1)=="MB/s") print $i}' <<<"$go_out")"
  awk -v m="$m" -v g="$g" -v h="${hf[$m]}" 'BEGIN {printf "%-12s %10.2f %10.2f %6.2fx\n", m, g, h, g/h}'
done
GOMAXPROCS=1 $pin go test -run '^$' -bench 'BenchmarkChatTurn' -benchtime 1000x ./tokenize/ | grep -E 'Benchmark|speedup'
