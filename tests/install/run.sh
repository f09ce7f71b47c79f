#!/usr/bin/env bash
# Out-of-tree install test: installs build dir $1 (default: build) into a
# temporary DESTDIR, builds tests/install/consumer.c against that copy with
# `pkg-config --cflags --libs tapegrad` only, runs it against the installed
# shared library, and checks that it prints OK. Touches nothing outside the
# build dir and the temporary dir, which is removed on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=${1:-build}
if [ ! -f "$build/build.ninja" ]; then
    echo "install test: '$build' is not a configured meson build dir" >&2
    exit 1
fi
build=$(cd "$build" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tapegrad-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root

meson install -C "$build" --destdir "$root" >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log" >&2
    echo "install test: meson install failed" >&2
    exit 1
}

pc=$(find "$root" -name tapegrad.pc -print -quit)
lib=$(find "$root" -name 'libtapegrad.so' -print -quit)
hdr=$(find "$root" -path '*/include/tapegrad.h' -print -quit)
for f in "$pc" "$lib" "$hdr"; do
    if [ -z "$f" ]; then
        echo "install test: tapegrad.pc, libtapegrad.so or tapegrad.h was not installed" >&2
        find "$root" >&2
        exit 1
    fi
done

# The .pc names the configured prefix; point it into DESTDIR instead.
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
prefix=$(pkg-config --variable=prefix tapegrad)
flags=$(pkg-config --define-variable=prefix="$root$prefix" --cflags --libs tapegrad)
case "$flags" in
*"-I$root$prefix/"*"-L$root$prefix/"*) ;;
*) echo "install test: pkg-config flags do not point into the install: $flags" >&2; exit 1 ;;
esac

# A sanitizer build's library needs the program built with the same runtime.
sanitize=$(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
v = next((o["value"] for o in json.load(sys.stdin) if o["name"] == "b_sanitize"), "none")
print(",".join(v) if isinstance(v, list) else v)')
san_flags=()
if [ -n "$sanitize" ] && [ "$sanitize" != none ]; then
    san_flags=(-fsanitize="$sanitize")
fi

read -r -a flag_list <<<"$flags"  # pkg-config output is a list of words
${CC:-cc} -std=c11 -Wall -Wextra -Werror "${san_flags[@]}" -o "$tmp/consumer" \
    "$here/consumer.c" "${flag_list[@]}" -lm
libdir=$(dirname "$lib")
resolved=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/consumer" | awk '/libtapegrad/ {print $3}')
case "$resolved" in
"$libdir"/*) ;;
*) echo "install test: consumer resolves libtapegrad to '$resolved', not the install" >&2; exit 1 ;;
esac
out=$(LD_LIBRARY_PATH=$libdir "$tmp/consumer")
echo "$out"
case "$out" in
OK*) echo "install test: passed ($flags)" ;;
*) echo "install test: consumer printed '$out', expected OK" >&2; exit 1 ;;
esac
