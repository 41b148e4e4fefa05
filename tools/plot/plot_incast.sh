#!/usr/bin/env bash
# Draws the goodput per flow-control policy from a mailrail_incast CSV (or a
# tools/fabric/incast_sweep.sh one) with gnuplot: the median over trials as a
# bar, every trial as a dot. PNG or SVG by the output's extension.
#
#   tools/plot/plot_incast.sh incast.csv [out.png [title]]
set -euo pipefail
csv=$1
out=${2:-${csv%.csv}.png}
title=${3:-Incast goodput per flow-control policy}
command -v gnuplot >/dev/null || { echo "plot_incast: gnuplot is not installed (Debian: gnuplot-nox)" >&2; exit 1; }

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# Block 0: "index policy median"; block 1: "index goodput" per trial.
subtitle=$(awk -F, -v out="$data" '
NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{
    p = $col["policy"]
    if (!(p in n)) order[++np] = p
    if ("goodput_mbps" in col) {
        v[p, ++n[p]] = $col["goodput_mbps"]
        sub_ = $col["ratio"] " senders per victim, " $col["victims"] " victim(s), " \
               $col["messages_per_sender"] " messages of " $col["bytes"] " bytes per sender, " \
               $col["substrate"] ", port buffer " $col["buffer"]
    } else {
        v[p, ++n[p]] = $col["goodput_gbps"] * 1000
        sub_ = $col["ranks"] " ranks, " $col["victims"] " victim(s), " $col["messages_per_rank"] \
               " messages of " $col["bytes"] " bytes per rank"
    }
}
function median(p,   i, j, t, a, k) {
    k = n[p]; for (i = 1; i <= k; i++) a[i] = v[p, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
END {
    if (np == 0) { print "plot_incast: no rows in the CSV" > "/dev/stderr"; exit 1 }
    for (k = 1; k <= np; k++) printf "%d %s %.3f\n", k - 1, order[k], median(order[k]) > out
    printf "\n\n" > out
    for (k = 1; k <= np; k++) for (j = 1; j <= n[order[k]]; j++) printf "%d %.3f\n", k - 1, v[order[k], j] > out
    print sub_
}' "$csv")

case $out in
    *.svg) term="svg size 640,420 dynamic font 'sans,12' background rgb 'white'" ;;
    *) term="pngcairo size 720,460 font 'sans,11'" ;;
esac
gnuplot <<GP
set terminal $term
set output '$out'
set title "$title\n{/*0.85 $subtitle}"
set ylabel "goodput (Mbit/s)"
set xlabel "flow-control policy"
set yrange [0:*]
set offsets 0.5, 0.5, graph 0.1, 0
set grid ytics
set boxwidth 0.6
set style fill solid 0.5 border -1
set key below
plot '$data' index 0 using 1:3:xtic(2) with boxes lc rgb '#1f77b4' title 'median of the trials', \
     '' index 1 using 1:2 with points pt 7 ps 1.2 lc rgb '#d62728' title 'one trial'
GP
echo "plot: $out"
