#!/usr/bin/env bash
# Combines separate runs of tools/perf_compare.sh into the worst of their
# medians, per contender and size: the lowest rate ratio and the highest
# latency ratio. Issue 13's target counts the worst of 3 runs. Prints two
# Markdown tables; a figure in bold meets the target (rate at least 0.95,
# latency at most 1.10), one in parentheses is missing from some runs.
#
# Usage: tools/perf_worst.sh OUT1 OUT2 [OUT3 ...]   (each a perf_compare -o directory)
set -euo pipefail

[ $# -ge 2 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
files=()
for d in "$@"; do
    [ -r "$d/perf_summary.csv" ] || { echo "perf_worst: no $d/perf_summary.csv" >&2; exit 1; }
    files+=("$d/perf_summary.csv")
done
awk -F, -v runs=$# '
    FNR == 1 { next }
    {
        k = $1 SUBSEP $2
        if (!($1 in seen)) { seen[$1] = 1; rows[++nr] = $1 }
        if (!($2 in sz)) { sz[$2] = 1; sizes[++ns] = $2 }
        if (!(k in rate) || $4 < rate[k]) rate[k] = $4
        if (!(k in lat) || $7 > lat[k]) lat[k] = $7
        n[k]++
    }
    function cell(v, ok, k) { return (n[k] < runs ? "(" : "") (ok ? sprintf("**%.2f**", v) : sprintf("%.2f", v)) (n[k] < runs ? ")" : "") }
    function table(what,   i, j, k) {
        printf "\n| %s ratio, worst of %d runs |", what, runs
        for (j = 1; j <= ns; j++) printf " %s B |", sizes[j]
        printf "\n| --- |"; for (j = 1; j <= ns; j++) printf " ---: |"; print ""
        for (i = 1; i <= nr; i++) {
            printf "| %s |", rows[i]
            for (j = 1; j <= ns; j++) {
                k = rows[i] SUBSEP sizes[j]
                if (!(k in n)) { printf " |"; continue }
                if (what == "rate") printf " %s |", cell(rate[k], rate[k] >= 0.95, k)
                else printf " %s |", cell(lat[k], lat[k] > 0 && lat[k] <= 1.10, k)
            }
            print ""
        }
    }
    END { table("rate"); if (lat[rows[1] SUBSEP sizes[1]] > 0) table("latency") }
' "${files[@]}"
