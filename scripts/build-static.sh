#!/usr/bin/env bash
# Builds bin/prefixrouter-static: prefixrouter with libzmq and everything
# below it linked statically, for the container image (`make image`).
#
# Debian's libzmq3-dev ships libzmq.a, and its static dependencies ship
# their archives too (libsodium, libpgm, libnorm with libprotokit, libbsd,
# libmd; libstdc++ comes with gcc) — all but GSS-API: MIT Kerberos is
# shared-only in Debian. deploy/static/gssapi_stub.c stands in for the
# eleven gss_* functions libzmq.a references (only a socket with
# ZMQ_GSSAPI_* set calls them; prefixrouter sets none, and they fail if
# called). glibc is linked statically as well: its resolver (files and DNS
# are built into libc since 2.34) reads /etc/nsswitch.conf, /etc/hosts and
# /etc/resolv.conf, so event endpoints may be host names; the linker's
# warnings about getaddrinfo needing glibc's shared NSS modules concern the
# other NSS services, which nothing here uses.
set -euo pipefail

out=${1:-bin/prefixrouter-static}
version=${VERSION:-dev}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gcc -c -O2 -Wall -Wextra -Werror deploy/static/gssapi_stub.c -o "$work/gssapi_stub.o"
ar rcs "$work/libgssapi_stub.a" "$work/gssapi_stub.o"

# netgo and osusergo keep Go's own DNS and user lookups (no cgo NSS calls).
libs="-lzmq -lsodium -lpgm -lnorm -lprotokit -lgssapi_stub -lbsd -lmd -lstdc++ -lrt -lpthread -lm"
CGO_ENABLED=1 go build -trimpath -tags netgo,osusergo \
  -ldflags "-s -w -X main.version=$version -linkmode external -extldflags '-static -L$work $libs'" \
  -o "$out" ./cmd/prefixrouter 2> >(grep -v -e 'in statically linked applications requires at runtime' -e 'in function `' -e '^# ' >&2)

if readelf -l "$out" | grep -q INTERP; then
  echo "build-static: $out is dynamically linked" >&2
  exit 1
fi
echo "built $out ($(du -h "$out" | cut -f1), static)"
