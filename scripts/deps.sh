#!/bin/sh
# Install the Debian packages the build and tests need, if any are missing.
set -e
# clang and libclang-rt-dev (its libFuzzer runtime, only a Recommends of clang)
# build the fuzz targets; libmicrohttpd-dev is the HTTP server of `muser serve`;
# libzstd-dev compresses kvpack chunks (docs/kvpack.md).
PKGS="cmake make gcc libssl-dev pkg-config python3 libpcre2-dev libjansson-dev python3-jinja2 libmicrohttpd-dev libzstd-dev clang libclang-rt-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# The server tests (tests/cli_server.sh) need node and npm (any source: a
# nodejs that bundles npm counts) and Debian's chromium for the chat page.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -z "$missing" ] && exit 0
echo "installing:$missing"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
