#!/usr/bin/env bash
# Installs the system packages the build and the tests need when they are missing.
# CI and new developer machines start from a bare Debian with Go and gcc.
set -euo pipefail

need=()
if ! pkg-config --exists libzmq 2>/dev/null; then
  need+=(libzmq3-dev pkg-config)
fi
# The benchmark report's test opens report.html in headless Chromium
# (bench/browser_test.go): Debian's chromium, not a browser a tool downloads.
if ! command -v chromium >/dev/null 2>&1; then
  need+=(chromium)
fi
# The alerting rules' checks (deploy/prometheus_test.go) run `promtool check
# rules` and `promtool test rules`: Debian's prometheus package (bookworm:
# 2.42), whose promtool is all they use. Its postinst starts no server
# where no init system runs (containers, CI).
if ! command -v promtool >/dev/null 2>&1; then
  need+=(prometheus)
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${need[*]} (run as root or install them)" >&2
  exit 1
fi
echo "installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${need[@]}" >/dev/null
