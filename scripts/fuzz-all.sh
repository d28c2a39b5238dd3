#!/usr/bin/env bash
# Runs each Go fuzz target in the module for a short time. Targets are found
# by name (func FuzzXxx) so a new fuzz target is picked up without edits here.
# Minimizing a newly interesting input can take the whole run (the default
# bound is 60s), so it is capped: these short runs are for finding failures.
set -euo pipefail
fuzztime="${1:-20000x}"
status=0
while IFS= read -r file; do
  dir="./$(dirname "$file")"
  for target in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)' "$file" | awk '{print $2}'); do
    echo "fuzz $dir $target ($fuzztime)"
    if ! go test -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s "$dir"; then
      status=1
    fi
  done
done < <(git ls-files '*_test.go' 2>/dev/null || find . -name '*_test.go' | sed 's|^\./||')
exit $status
