#!/usr/bin/env bash
# Fails when a source file includes a header from a layer above its own
# (docs/architecture.md, "Layers"). The build already gives each layer only
# the include paths of the layers below it; this check also catches what an
# include path cannot: relative paths ("../") and a header reached through
# the including file's own directory.
#
#   tests/check_layers.sh [source-root]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"

# The directories whose headers a file in each layer may include. Generated
# headers (mr_build_paths.h, mr_flowctl_builtin.h) are allowed by name.
abi="core/include core/plugin"
allowed_for() {
    case "$1" in
        core/include/*) echo "core/include" ;;
        core/plugin/*) echo "$abi" ;;
        core/bootstrap/*) echo "$abi" ;;
        core/base/*) echo "$abi core/base" ;;
        flowctl/*) echo "$abi core/base flowctl $(dirname "$1")" ;;
        core/runtime/*) echo "$abi core/base flowctl flowctl/node core/runtime" ;;
        substrates/common/*) echo "$abi substrates/common" ;;
        substrates/*) echo "$abi substrates/common $(dirname "$1")" ;;
        *) return 1 ;;
    esac
}
generated="mr_build_paths.h mr_flowctl_builtin.h"

bad=0
checked=0
while IFS= read -r file; do
    dirs=$(allowed_for "$file") || continue
    checked=$((checked + 1))
    while IFS= read -r header; do
        case " $generated " in *" $header "*) continue ;; esac
        if [[ $header == */* ]]; then
            echo "$file: #include \"$header\": a path; include by name from a lower layer" >&2
            bad=1
            continue
        fi
        found=0
        for d in $dirs; do
            [[ -f $d/$header ]] && found=1
        done
        if ((found == 0)); then
            owner=$(find core flowctl substrates -name "$header" -print -quit)
            echo "$file: #include \"$header\" (${owner:-not found}) is not in its layer or below (${dirs// /, })" >&2
            bad=1
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
done < <(find core flowctl substrates -name '*.[ch]' | sort)

if ((checked == 0)); then
    echo "check_layers: no source file found under $(pwd)" >&2
    exit 1
fi
((bad == 0)) && echo "check_layers: $checked files keep to their layers"
exit $bad
