#!/usr/bin/env bash
# Runs every Go fuzz target in the module for a number of executions:
# scripts/fuzz-all.sh [EXECS] (default 20000). Targets are found by name
# (func FuzzXxx) so a new fuzz target is picked up without edits here.
#
# Each package's fuzz-instrumented test binary is built once, then the
# targets run FUZZ_JOBS at a time (default: one per core), each with one
# fuzzing worker: on two cores two targets proceed side by side instead of
# one target's two workers waiting on its coordinator's start-up. A target's
# output is printed when it ends, one block per target, and only in full
# when it fails.
#
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# report a spurious "context deadline exceeded" as the time runs out
# (golang/go#75804, fixed in Go 1.27); a count has no deadline to race.
# Minimizing a newly interesting input can take the whole run (the default
# bound is 60s), so it is capped: these runs are for finding failures.
# Crashers are written to the package's testdata/fuzz/, as `go test -fuzz`
# does, and the corpus grows in the same cache `go test -fuzz` uses.
set -euo pipefail
cd "$(dirname "$0")/.."
execs="${1:-20000}"
execs="${execs%x}"
jobs="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}"
module="$(go list -m)"
cachedir="$(go env GOCACHE)/fuzz"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# targets: one line per target, "dir target".
targets="$work/targets"
{ git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go' | sed 's|^\./||'; } |
  xargs grep -oE '^func Fuzz[A-Za-z0-9_]+' |
  sed -E 's|^(.*)/[^/]*:func |\1 |' | sort -u >"$targets"
dirs="$(awk '{print $1}' "$targets" | sort -u)"
ntargets="$(wc -l <"$targets")"
npkgs="$(wc -w <<<"$dirs")"

binary() { echo "$work/bin/$(tr / _ <<<"$1").test"; }
export -f binary
export work

echo "fuzz: building $npkgs fuzz-instrumented test binaries ..."
mkdir -p "$work/bin"
if ! xargs -P "$jobs" -I{} bash -c 'go test -c -fuzz=. -o "$(binary {})" ./{}' <<<"$dirs"; then
  echo "fuzz: build failed" >&2
  exit 1
fi

echo "fuzz: $ntargets targets x $execs execs, $jobs at a time ..."
# run_target DIR TARGET: one target from its package directory (where a
# crasher is written), reporting one line, or the whole output on failure.
run_target() {
  local dir="$1" target="$2" out start status=0
  out="$work/out.$(tr / _ <<<"$dir").$target"
  start=$(date +%s)
  (cd "$dir" && "$(binary "$dir")" -test.paniconexit0 -test.run '^$' \
    -test.fuzz "^${target}\$" -test.fuzztime "${execs}x" -test.fuzzminimizetime 5s \
    -test.parallel 1 -test.timeout 10m -test.fuzzcachedir "$cachedir/$module/$dir") >"$out" 2>&1 || status=$?
  if [ "$status" -eq 0 ]; then
    printf 'fuzz: ok   %-28s %-20s %3ds\n' "$target" "$dir" "$(($(date +%s) - start))"
  else
    printf 'fuzz: FAIL %-28s %-20s %3ds\n' "$target" "$dir" "$(($(date +%s) - start))"
    cat "$out"
  fi
  return "$status"
}
export -f run_target
export execs cachedir module
if ! xargs -P "$jobs" -L 1 bash -c 'run_target "$0" "$1"' <"$targets"; then
  echo "fuzz: failed (crashers, if any, are under the packages' testdata/fuzz/)" >&2
  exit 1
fi
