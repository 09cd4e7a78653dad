#!/bin/sh
# Install the Debian packages the build and tests need, if any are missing.
set -e
# clang and libclang-rt-dev (its libFuzzer runtime, only a Recommends of clang)
# build the fuzz targets; libmicrohttpd-dev is the HTTP server of `muser serve`.
PKGS="cmake make gcc libssl-dev pkg-config python3 libpcre2-dev libjansson-dev python3-jinja2 libmicrohttpd-dev clang libclang-rt-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
