#!/usr/bin/env bash
# Fails when a command printed in the documentation no longer runs.
#
#   tests/check_doc_commands.sh SOURCE_DIR BUILD_DIR
#
# Reads the fenced ```sh, ```bash, ```shell and ```console blocks of README.md
# and docs/*.md (not docs/notes/, which is dated history). In sh/bash blocks
# every line is a command ('$ ' prompts and '#' comments stripped); in console
# blocks only lines after a '$ ' or '# ' prompt are, the rest is output. A line
# ending in '\' continues on the next. Every command that names a MailRail
# tool (build*/tools/mailrail_*, an installed mailrail_* name, build*/tests/*,
# tools/*.sh, tools/quickstart, tools/fabric/*.sh, tools/plot/*.sh,
# tools/graph/*.sh, meson test|setup|configure) is checked:
#
#   - the program exists (built in BUILD_DIR, or in SOURCE_DIR and executable);
#   - every option it is given (-x, --long) appears in its usage text: the
#     output of `PROG -h` for a built tool, the leading comment block for a
#     script, `meson SUBCOMMAND --help` for meson;
#   - `meson test` names only tests and suites that exist, `-Dname=` only
#     options that exist; every MAILRAIL_* variable set is a setting that
#     mailrail_info lists (or MAILRAIL_UCX_<NAME>, UCX's own, passed through);
#   - build/tools/mailrail_info, and every command of a block preceded by the
#     line <!-- doc-commands: run --> (small jobs, a few seconds each, no root,
#     no fabric), is run for real, bounded by `timeout -k 5 60`, in a scratch
#     directory where build/ is BUILD_DIR and tools/ is SOURCE_DIR/tools, and
#     must exit 0.
#
# A block preceded by <!-- doc-commands: skip --> is not read (for output that
# looks like commands; use sparingly). Prints one line per command ("ok:",
# "ran:", or "FAIL: file:line: why") and a summary; exits 1 on any failure or
# when it finds fewer than 10 commands, so that it cannot pass by reading
# nothing.
set -euo pipefail

if [ $# -ne 2 ]; then
    echo "usage: $0 SOURCE_DIR BUILD_DIR" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
min_commands=10
run_limit=60

scratch=$(mktemp -d "${TMPDIR:-/tmp}/doc-commands.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
mkdir "$scratch/work"
ln -s "$build" "$scratch/work/build"
ln -s "$src/tools" "$scratch/work/tools"

checked=0 ran=0 failures=0
declare -A usage_cache=()
settings=''
meson_tests='' meson_suites='' meson_options=''

# ---- Reading the documents -----------------------------------------------------------

# Prints "file<TAB>line<TAB>check|run<TAB>command" for every command of the
# shell blocks of the files named (relative to the current directory).
extract_commands() {
    awk '
    function strip_comment(s,    i, c, q) {
        q = ""
        for (i = 1; i <= length(s); i++) {
            c = substr(s, i, 1)
            if (q != "") { if (c == q) q = ""; continue }
            if (c == "\"" || c == "\047") { q = c; continue }
            if (c == "\\") { i++; continue }
            if (c == "#" && (i == 1 || substr(s, i - 1, 1) ~ /[ \t]/)) return substr(s, 1, i - 1)
        }
        return s
    }
    function emit() {
        gsub(/[ \t]+/, " ", pending); sub(/^ /, "", pending); sub(/ $/, "", pending)
        if (pending != "") printf "%s\t%d\t%s\t%s\n", FILENAME, start, mode, pending
        pending = ""
    }
    FNR == 1 { inb = 0; other = 0; marker = ""; pending = "" }
    { sub(/\r$/, "") }
    /^[ \t]*```/ {
        if (inb || other) { if (pending != "") emit(); inb = 0; other = 0; marker = ""; next }
        lang = $0; sub(/^[ \t]*```[ \t]*/, "", lang); sub(/[ \t{,].*/, "", lang)
        if ((lang == "sh" || lang == "bash" || lang == "shell" || lang == "console") && marker != "skip") {
            inb = 1; console = (lang == "console"); mode = (marker == "run" ? "run" : "check")
        } else other = 1
        marker = ""; next
    }
    other { next }
    !inb {
        if ($0 ~ /<!--[ \t]*doc-commands:[ \t]*skip[ \t]*-->/) marker = "skip"
        else if ($0 ~ /<!--[ \t]*doc-commands:[ \t]*run[ \t]*-->/) marker = "run"
        else if ($0 !~ /^[ \t]*$/) marker = ""
        next
    }
    {
        line = $0
        if (pending == "") {
            if (console) {
                if (line !~ /^[ \t]*[$#] /) next
                sub(/^[ \t]*[$#] /, "", line)
            } else {
                sub(/^[ \t]*\$ /, "", line)
                if (line ~ /^[ \t]*(#|$)/) next
            }
            start = FNR
        }
        line = strip_comment(line)
        if (line ~ /\\[ \t]*$/) { sub(/\\[ \t]*$/, "", line); pending = pending line " "; next }
        pending = pending line
        emit()
    }' "$@"
}

# Prints the words of a command line one per line; operators (; | & ( ) and
# the MPMD colon of mpiexec) as "<SEP>", redirections as "<REDIR>". Quoted
# words keep their quotes, so that they are never taken for options.
tokenize() {
    awk '
    function flush() { if (tok != "") print tok; tok = "" }
    {
        s = $0; n = length(s); tok = ""; q = ""
        for (i = 1; i <= n; i++) {
            c = substr(s, i, 1)
            if (q != "") { tok = tok c; if (c == q) q = ""; continue }
            if (c == "\"" || c == "\047") { q = c; tok = tok c; continue }
            if (c == "\\" && i < n) { tok = tok substr(s, i + 1, 1); i++; continue }
            if (c == " " || c == "\t") { flush(); continue }
            if (c ~ /[;|&()]/) { flush(); print "<SEP>"; continue }
            if (c ~ /[<>]/) { if (tok ~ /^[0-9]$/) tok = ""; flush(); print "<REDIR>"; continue }
            tok = tok c
        }
        flush()
    }' <<<"$1" | sed 's/^:$/<SEP>/'
}

# ---- What the programs accept ----------------------------------------------------------

# Sets prog_kind (tool, test, script, meson or empty) and prog_path for a word.
classify() {
    local w=$1
    prog_kind='' prog_path=''
    w=${w#./}
    if [[ $w =~ ^[A-Za-z0-9_.-]*build[A-Za-z0-9_.-]*/tools/((graph/|moe/)?mailrail_[a-z_]+)$ ]]; then
        prog_kind=tool prog_path=$build/tools/${BASH_REMATCH[1]}
    elif [[ $w =~ ^[A-Za-z0-9_.-]*build[A-Za-z0-9_.-]*/tests/([A-Za-z0-9_-]+)$ ]]; then
        prog_kind=test prog_path=$build/tests/${BASH_REMATCH[1]}
    elif [[ $w =~ ^tools/[A-Za-z0-9_/.-]+$ ]]; then
        prog_kind=script prog_path=$src/$w
    elif [ "$w" = mailrail_apt_depgraph ]; then
        prog_kind=script prog_path=$src/tools/graph/apt_depgraph.sh
    elif [ "$w" = mailrail_graph_table ]; then
        prog_kind=script prog_path=$src/tools/graph/graph_table.sh
    elif [[ $w =~ ^mailrail_[a-z_]+$ ]]; then
        prog_kind=tool prog_path=$build/tools/$w
        for d in graph moe; do
            [ -e "$prog_path" ] || [ ! -e "$build/tools/$d/$w" ] || prog_path=$build/tools/$d/$w
        done
    elif [ "$w" = meson ]; then
        prog_kind=meson prog_path=meson
    fi
}

# Prints the usage text of a program (cached).
usage_text() {
    local kind=$1 path=$2 key="$1:$2"
    if [ -z "${usage_cache[$key]+set}" ]; then
        case $kind in
        tool) usage_cache[$key]=$(timeout -k 2 10 "$path" -h 2>&1 </dev/null || true) ;;
        script) usage_cache[$key]=$(awk 'NR > 1 && !/^#/ { exit } NR > 1' "$path") ;;
        meson) usage_cache[$key]=$(meson "${path#meson }" --help 2>&1 || true) ;;
        esac
    fi
    printf '%s\n' "${usage_cache[$key]}"
}

# Is option OPT (-x or --long) in the usage text USAGE?
option_in_usage() {
    local opt=$1 usage=$2
    grep -Eq -- "(^|[^A-Za-z0-9_-])${opt}([^A-Za-z0-9_-]|$)" <<<"$usage"
}

load_meson_lists() {
    [ -z "$meson_tests" ] || return 0
    meson_tests=$(meson test -C "$build" --list --no-rebuild 2>/dev/null | awk -F' / ' 'NF == 2 { print $2 }')
    meson_suites=$(meson test -C "$build" --list --no-rebuild 2>/dev/null |
        awk -F' / ' 'NF == 2 { n = split($1, s, "+"); for (i = 1; i <= n; i++) { sub(/^[^:]*:/, "", s[i]); print s[i] } }' | sort -u)
    meson_options=$(meson introspect --buildoptions "$build" 2>/dev/null |
        grep -o '"name": *"[^"]*"' | sed 's/.*"\([^"]*\)"$/\1/')
    [ -n "$meson_tests" ] || meson_tests='(none)'
}

# ---- Checking one command --------------------------------------------------------------

problems=()
found_program=0

# Checks the words of one simple command (no operators): env assignments,
# the MailRail program it runs and that program's options.
check_segment() {
    local words=("$@") i=0 n=$# w prog_i=-1 usage sub opt
    [ "$n" -gt 0 ] || return 0
    for ((i = 0; i < n; i++)); do
        w=${words[$i]}
        if [[ $w =~ ^(MAILRAIL_[A-Z0-9_]+)= ]]; then
            local name=${BASH_REMATCH[1]}
            grep -qx "$name" <<<"$settings" || [[ $name == MAILRAIL_UCX_* ]] ||
                problems+=("$name is not a MailRail setting (mailrail_info -c)")
            continue
        fi
        classify "$w"
        if [ -n "$prog_kind" ]; then prog_i=$i; break; fi
    done
    [ "$prog_i" -ge 0 ] || return 0
    found_program=1
    local kind=$prog_kind path=$prog_path
    case $kind in
    tool | test)
        [ -x "$path" ] || { problems+=("${words[$prog_i]}: not built (no $path)"); return 0; } ;;
    script)
        [ -f "$path" ] || { problems+=("${words[$prog_i]}: no such file in the source tree"); return 0; }
        [ -x "$path" ] || { problems+=("${words[$prog_i]}: not executable"); return 0; } ;;
    meson)
        sub=${words[$((prog_i + 1))]:-}
        [ -n "$sub" ] || return 0
        path="meson $sub"
        prog_i=$((prog_i + 1)) ;;
    esac
    [ "$kind" != test ] || return 0
    usage=$(usage_text "$kind" "$path")
    [ -n "$usage" ] || { problems+=("${words[$prog_i]}: no usage text"); return 0; }

    local skip_next=0 expect='' rest=()
    for ((i = prog_i + 1; i < n; i++)); do
        w=${words[$i]}
        if [ "$w" = "<REDIR>" ]; then skip_next=1; continue; fi
        if [ "$skip_next" = 1 ]; then skip_next=0; continue; fi
        if [ -n "$expect" ]; then
            case $expect in
            suite)
                load_meson_lists
                grep -qx "$w" <<<"$meson_suites" || problems+=("meson test: no suite '$w'") ;;
            builddir)
                [ "$w" = build ] || [ -d "$src/$w" ] || [ -d "$w" ] || problems+=("meson -C $w: no such build directory") ;;
            esac
            expect=''
            continue
        fi
        if [ "$w" = "--" ]; then
            # What follows is another program's command line (fabric.sh -- PROG ARGS).
            rest=("${words[@]:$((i + 1))}")
            check_segment "${rest[@]}"
            return 0
        fi
        case $w in
        \"* | \'*) continue ;;
        --*=*) opt=${w%%=*} ;;
        --?*) opt=$w ;;
        -[0-9]*) continue ;;
        -D*)
            if [ "$kind" = meson ]; then
                load_meson_lists
                opt=${w#-D}; opt=${opt%%=*}
                grep -qx "$opt" <<<"$meson_options" || problems+=("meson: no option -D$opt")
                continue
            fi
            opt=$w ;;
        -[A-Za-z]*) opt=$w ;;
        *)
            if [ "$kind" = meson ] && [ "$path" = "meson test" ] && [[ $w =~ ^[A-Za-z0-9_.-]+$ ]]; then
                load_meson_lists
                grep -qx "$w" <<<"$meson_tests" || problems+=("meson test: no test '$w'")
            fi
            continue ;;
        esac
        if ! option_in_usage "$opt" "$usage"; then
            # -abc: a bundle of short options, or one taking its argument glued on.
            if [[ $opt =~ ^-[A-Za-z][A-Za-z0-9]+$ ]] && option_in_usage "${opt:0:2}" "$usage"; then
                :
            else
                problems+=("${words[$prog_i]}: option $opt is not in its usage text")
            fi
        fi
        if [ "$kind" = meson ]; then
            case $opt in
            --suite | --no-suite) expect=suite ;;
            -C) expect=builddir ;;
            --num-processes | --setup | --wrapper | --test-args | --timeout-multiplier | -t | \
                --repeat | --logbase | --max-lines | --gdb-path | --backend | --buildtype | \
                --prefix | --native-file | --cross-file)
                [[ $w == *=* ]] || expect=other ;;
            esac
        fi
    done
}

# Checks (and with MODE run, runs) one documented command.
check_command() {
    local file=$1 line=$2 mode=$3 cmd=$4 tokens=() segment=() t start elapsed log
    mapfile -t tokens < <(tokenize "$cmd")
    problems=()
    found_program=0
    for t in "${tokens[@]}" "<SEP>"; do
        if [ "$t" = "<SEP>" ]; then
            if [ ${#segment[@]} -gt 0 ]; then check_segment "${segment[@]}"; fi
            segment=()
        else
            segment+=("$t")
        fi
    done
    [ "$found_program" = 1 ] || return 0
    checked=$((checked + 1))
    if [ ${#problems[@]} -gt 0 ]; then
        for t in "${problems[@]}"; do echo "FAIL: $file:$line: $t  [$cmd]"; done
        failures=$((failures + 1))
        return 0
    fi
    if [ "$mode" = run ] || [[ $cmd =~ ^build/tools/mailrail_info( |$) ]]; then
        log=$scratch/run.log
        start=$SECONDS
        if (cd "$scratch/work" && timeout -k 5 "$run_limit" bash -c "$cmd") >"$log" 2>&1 </dev/null; then
            elapsed=$((SECONDS - start))
            echo "ran: $file:$line: $cmd (${elapsed} s)"
            ran=$((ran + 1))
        else
            local status=$?
            echo "FAIL: $file:$line: exit status $status: $cmd"
            tail -n 15 "$log" | sed 's/^/    /'
            failures=$((failures + 1))
        fi
    else
        echo "ok: $file:$line: $cmd"
    fi
}

# ---- Main ------------------------------------------------------------------------------

[ -x "$build/tools/mailrail_info" ] || { echo "FAIL: no $build/tools/mailrail_info: build first" >&2; exit 1; }
settings=$("$build/tools/mailrail_info" -c 2>/dev/null | grep -oE '^MAILRAIL_[A-Z0-9_]+' || true)
[ -n "$settings" ] || { echo "FAIL: mailrail_info -c lists no settings" >&2; exit 1; }

cd "$src"
docs=(README.md)
for f in docs/*.md; do if [ -f "$f" ]; then docs+=("$f"); fi; done
while IFS=$'\t' read -r file line mode cmd; do
    check_command "$file" "$line" "$mode" "$cmd"
done < <(extract_commands "${docs[@]}")

echo "doc-commands: $checked commands checked in ${#docs[@]} files, $ran run for real, $failures failed"
if [ "$checked" -lt "$min_commands" ]; then
    echo "FAIL: only $checked commands found (at least $min_commands expected): is the extraction broken?"
    exit 1
fi
[ "$failures" -eq 0 ]
