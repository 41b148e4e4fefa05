#!/usr/bin/env bash
# Which functions of libmailrail.so (and the substrate plugins) two builds
# compiled differently: for a change that should not touch the hot path (a
# file split, a rename), identical machine code settles what instruction
# counts, which move with timing (docs/performance.md), cannot. Addresses,
# call targets' offsets and padding are ignored; each function is compared by
# its instructions in order.
#
# Usage: tools/perf_code_diff.sh BUILD_A BUILD_B
#   e.g. two release builds of two commits (meson setup --buildtype=release).
# Prints each function whose code differs (or that one build lacks) with its
# instruction counts, then a summary line; exits 0 when all are identical, 1
# when some differ, 2 on bad usage.
set -euo pipefail

if [ $# -ne 2 ] || [ ! -d "$1" ] || [ ! -d "$2" ]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2
    exit 2
fi
command -v objdump >/dev/null || { echo "perf_code_diff: objdump (binutils) is missing" >&2; exit 2; }

# Prints "object:function count code" for every function of the objects under
# build $1, the code one word: its normalised instructions joined by "|".
signatures() {
    local lib
    for lib in "$1"/core/runtime/libmailrail.so "$1"/substrates/*/mailrail_substrate_*.so; do
        [ -e "$lib" ] || continue
        objdump -d --no-show-raw-insn "$lib" | awk -v obj="$(basename "$lib")" '
            function flush() { if (name != "") print obj ":" name, n, (n ? body : "-") }
            /^[0-9a-f]+ <.*>:$/ {
                flush(); name = $2; gsub(/[<>:]/, "", name); n = 0; body = ""
                sub(/\.lto_priv\.[0-9]+$/, "", name)   # LTO copies: by their base name
                next
            }
            /^ +[0-9a-f]+:\t/ {
                sub(/^ +[0-9a-f]+:\t/, "")
                if ($0 ~ /^(nop|xchg +%ax,%ax|data16|cs nop)/) next   # padding
                gsub(/[0-9a-f]+ <[^>]*>/, "<T>")                      # branch and call targets
                gsub(/-?0x[0-9a-f]+\(%rip\)/, "X(%rip)")              # PC-relative data
                sub(/ *#.*$/, "")
                gsub(/[ \t]+/, "_")
                n++; body = body "|" $0
            }
            END { flush() }'
    done | LC_ALL=C sort -k1,1
}

a=$(mktemp) b=$(mktemp)
trap 'rm -f "$a" "$b"' EXIT
signatures "$1" >"$a"
signatures "$2" >"$b"
[ -s "$a" ] && [ -s "$b" ] || { echo "perf_code_diff: no libmailrail.so under $1 or $2; build first" >&2; exit 2; }
LC_ALL=C join -a1 -a2 -e - -o 0,1.2,1.3,2.2,2.3 "$a" "$b" | awk -v A="$1" -v B="$2" '
    { total++ }
    $3 != $5 { diff++; printf "%-50s %6s %6s instructions (%s, %s)\n", $1, $2, $4, A, B }
    END { printf "perf_code_diff: %d of %d functions differ\n", diff, total; exit diff > 0 }'
