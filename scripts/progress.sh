#!/usr/bin/env bash
# progress.sh LABEL COMMAND...: runs COMMAND and, while it runs, prints
# "LABEL: Ns ..." every PROGRESS_EVERY seconds (default 20), so that a step
# whose own output comes only at its end (go test prints a package's line
# when the package is done) is never silent for long; at the end it prints
# "LABEL: done in Ns" (or "failed after Ns"), so that a log shows where the
# time went. Exits with COMMAND's status.
set -uo pipefail
label="$1"
shift
every="${PROGRESS_EVERY:-20}"
# The ticker waits on a pipe with read's timeout, not on sleep, so that one
# line down the pipe stops it at once and it leaves no process behind.
dir="$(mktemp -d)"
mkfifo "$dir/stop"
exec 3<>"$dir/stop"
rm -r "$dir"
start=$SECONDS
(
  while ! read -r -t "$every" -u 3; do
    echo "$label: $((SECONDS - start))s ..."
  done
) &
ticker=$!
"$@"
status=$?
echo >&3
wait "$ticker"
if [ "$status" -eq 0 ]; then
  echo "$label: done in $((SECONDS - start))s"
else
  echo "$label: failed after $((SECONDS - start))s"
fi
exit "$status"
