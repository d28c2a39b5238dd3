#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a number of executions:
# scripts/fuzz-all.sh [--fresh] [EXECS] (default 20000). Targets are found by
# name (func FuzzXxx) so a new fuzz target is picked up without edits here.
#
# Each package's fuzz-instrumented test binary is built once, into bin/fuzz/
# (the go command leaves a binary that is up to date as it is, so an
# unchanged package is not linked again), without DWARF and the symbol
# table (-s -w): linking is most of a build whose packages are cached, and
# those tables roughly double it, while panics and stack traces need
# neither. -trimpath lets every checkout of the same code share the
# compiled packages in the build cache (see the Makefile's unit). The targets then run FUZZ_JOBS at
# a time (default: one per core), each with one fuzzing worker, the ones
# that took longest last time first: on two cores two targets proceed side
# by side instead of one target's two workers waiting on its coordinator's
# start-up, and no long target is left to run alone at the end. A target's
# output is printed when it ends, one line per target, and in full when it
# fails.
#
# Without --fresh the corpus grows in the cache `go test -fuzz` uses
# (GOCACHE/fuzz), and every run first replays all of it. With --fresh a
# run starts from the seed corpora alone (f.Add and testdata/fuzz) in a
# throwaway cache, as on a fresh CI machine: its time does not grow with
# what earlier runs found. Either way a crasher is written to the package's
# testdata/fuzz/, as `go test -fuzz` does.
#
# A count, not a duration: see the Makefile on Go 1.26's fuzz deadline bug.
# Minimizing a newly interesting input can take the whole run (the default
# bound is 60s), so it is capped: these runs are for finding failures.
set -euo pipefail
cd "$(dirname "$0")/.."
fresh=false
if [ "${1:-}" = --fresh ]; then
  fresh=true
  shift
fi
execs="${1:-20000}"
execs="${execs%x}"
jobs="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}"
module="$(go list -m)"
bindir="$PWD/bin/fuzz"
durations="$bindir/durations" # "seconds dir target" from the last run

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cachedir="$(go env GOCACHE)/fuzz"
corpus="the corpus in $cachedir"
if $fresh; then
  cachedir="$work/cache"
  corpus="the seed corpora"
fi

# targets: "dir target" a line, longest last time first (new ones first).
{ git ls-files --cached --others --exclude-standard '*_test.go' 2>/dev/null || find . -name '*_test.go' | sed 's|^\./||'; } |
  xargs grep -oE '^func Fuzz[A-Za-z0-9_]+' |
  sed -E 's|^(.*)/[^/]*:func |\1 |' | sort -u >"$work/found"
touch "$work/last"
[ -f "$durations" ] && cp "$durations" "$work/last"
awk 'FILENAME == ARGV[1] { last[$2 " " $3] = $1; next }
     { k = $1 " " $2; print (k in last ? last[k] : 1e9), k }' "$work/last" "$work/found" |
  sort -k1,1nr -k2 | cut -d' ' -f2- >"$work/targets"
dirs="$(awk '{print $1}' "$work/targets" | sort -u)"
ntargets="$(wc -l <"$work/targets")"

binary() { echo "$bindir/$(tr / _ <<<"$1").test"; }
export -f binary
export bindir

echo "fuzz: building $(wc -w <<<"$dirs") fuzz-instrumented test binaries into bin/fuzz ..."
mkdir -p "$bindir"
if ! ./scripts/progress.sh "fuzz: building" xargs -r -P "$jobs" -I{} bash -c 'go test -c -fuzz=. -trimpath -ldflags="-s -w" -o "$(binary {})" ./{}' <<<"$dirs"; then
  echo "fuzz: build failed" >&2
  exit 1
fi

echo "fuzz: $ntargets targets x $execs execs from $corpus, $jobs at a time ..."
started=$SECONDS
# run_target DIR TARGET: one target from its package directory (where a
# crasher is written), reporting one line, or the whole output on failure.
run_target() {
  local dir="$1" target="$2" out start secs status=0
  out="$work/out.$(tr / _ <<<"$dir").$target"
  start=$(date +%s)
  (cd "$dir" && "$(binary "$dir")" -test.paniconexit0 -test.run '^$' \
    -test.fuzz "^${target}\$" -test.fuzztime "${execs}x" -test.fuzzminimizetime 5s \
    -test.parallel 1 -test.timeout 10m -test.fuzzcachedir "$cachedir/$module/$dir") >"$out" 2>&1 || status=$?
  secs=$(($(date +%s) - start))
  echo "$secs $dir $target" >>"$work/took"
  if [ "$status" -eq 0 ]; then
    printf 'fuzz: ok   %-28s %-20s %3ds\n' "$target" "$dir" "$secs"
  else
    printf 'fuzz: FAIL %-28s %-20s %3ds\n' "$target" "$dir" "$secs"
    cat "$out"
  fi
  return "$status"
}
export -f run_target
export work execs cachedir module
status=0
xargs -r -P "$jobs" -L 1 bash -c 'run_target "$0" "$1"' <"$work/targets" || status=$?
[ -f "$work/took" ] && cp "$work/took" "$durations"
if [ "$status" -ne 0 ]; then
  echo "fuzz: failed after $((SECONDS - started))s (crashers, if any, are under the packages' testdata/fuzz/)" >&2
  exit 1
fi
echo "fuzz: $ntargets targets done in $((SECONDS - started))s"
