#!/bin/sh
# Summarises mailrail_graph CSV rows (-c FILE) as a Markdown table: for each
# policy and phase, the trial with the best time, its counters, and the
# speed-up against the first policy in the file.
#
#   tools/graph/graph_table.sh graph.csv
set -eu
if [ $# -ne 1 ]; then
    echo "usage: $0 graph.csv" >&2
    exit 2
fi
awk -F, '
NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{
    if (ranks == "") ranks = $col["ranks"]
    if ($col["ranks"] != ranks) { print "graph_table.sh: rows of " ranks " and " $col["ranks"] " ranks in one file" > "/dev/stderr"; bad = 1; exit 1 }
    key = $col["policy"] SUBSEP $col["phase"]
    if (!(key in best) || $col["seconds"] < best[key]) { best[key] = $col["seconds"]; row[key] = $0 }
    if (!($col["policy"] in seen_policy)) { seen_policy[$col["policy"]] = 1; policies[np++] = $col["policy"] }
    if (!($col["phase"] in seen_phase)) { seen_phase[$col["phase"]] = 1; phases[nph++] = $col["phase"] }
}
END {
    if (bad) exit 1
    print "| Phase | Policy | Best time (s) | Speed-up | Messages | MB | Busiest rank share | Its peak slots | Its peak RSS (MiB) | Credit returns |"
    print "|---|---|---|---|---|---|---|---|---|---|"
    for (p = 0; p < nph; p++) {
        for (q = 0; q < np; q++) {
            key = policies[q] SUBSEP phases[p]
            if (!(key in row)) continue
            split(row[key], f, ",")
            base = best[policies[0] SUBSEP phases[p]]
            printf "| %s | %s | %.4f | %s | %d | %.1f | %.1f%% | %d | %.1f | %d |\n", phases[p], policies[q],
                f[col["seconds"]], q == 0 || f[col["seconds"]] <= 0 ? "—" : sprintf("%.2fx", base / f[col["seconds"]]),
                f[col["messages"]], f[col["bytes"]] / 1e6, 100 * f[col["busiest_share"]],
                f[col["busiest_peak_recv_slots"]], f[col["busiest_peak_rss_kb"]] / 1024,
                f[col["credit_returns"]]
        }
    }
}' "$1"
