#!/usr/bin/env bash
# Fails when a source file includes a header from a layer above its own
# (docs/architecture.md, "Layers"). The build already gives each layer only
# the include paths of the layers below it; this check also catches what an
# include path cannot: relative paths ("../"), a header reached through
# the including file's own directory, and a room's private state (x_state.h,
# for x*.c only; the item layer, say, reaches the datapath through datapath.h).
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
        # A room's private state (x_state.h) belongs to the files of that room (x*.c).
        if [[ $header == *_state.h && $(basename "$file") != "${header%_state.h}"* ]]; then
            echo "$file: #include \"$header\": private to ${header%_state.h}*.c; use ${header%_state.h}.h" >&2
            bad=1
            continue
        fi
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

# The top level is the one README.md's layout names, and nothing else.
expected=".ci .gitignore LICENSE README.md core docs flowctl meson.build meson_options.txt substrates tests tools"
# A checkout (.git is a file in a worktree) lists what git tracks; a tarball, what is there.
if [[ -e .git ]] && command -v git >/dev/null; then
    top=$(git ls-files | cut -d/ -f1 | LC_ALL=C sort -u | tr '\n' ' ')
else
    top=$(find . -mindepth 1 -maxdepth 1 ! -name 'build*' -printf '%f\n' | LC_ALL=C sort | tr '\n' ' ')
fi
if [[ ${top% } != "$expected" ]]; then
    echo "the top level holds: ${top% }" >&2
    echo "  README.md's layout: $expected" >&2
    bad=1
fi

if ((checked == 0)); then
    echo "check_layers: no source file found under $(pwd)" >&2
    exit 1
fi
((bad == 0)) && echo "check_layers: $checked files keep to their layers"
exit $bad
