#!/usr/bin/env bash
# Draws the victim's view of one incast run over time, two policies side by
# side (one column each), from the CSV that `incast_sweep.sh timeline` joins:
#
#   policy,elapsed_s,arrivals_mbps,recv_slots_in_use,port_backlog_kb,port_drops,
#   granted_node0,granted_node1,...
#
# Rows, top to bottom: what arrived per sample interval (Mbit/s), the receive
# slots in use, the credits outstanding per sending node (granted, message not
# arrived), and the victim switch port's queue (KB) with its drops since the
# start (right axis).
#
#   tools/plot/plot_timeline.sh -i IN.csv -o OUT.png -t TITLE [-p POLICY,POLICY] [-r LINE_MBPS]
set -euo pipefail

usage() { sed -n '2,14p' "$0" >&2; exit 2; }
in='' out='' title='' policies='rank,node' ref=''
while getopts "i:o:t:p:r:" c; do
    case $c in
        i) in=$OPTARG ;; o) out=$OPTARG ;; t) title=$OPTARG ;; p) policies=$OPTARG ;;
        r) ref=$OPTARG ;; *) usage ;;
    esac
done
[ -n "$in" ] && [ -n "$out" ] || usage
command -v gnuplot >/dev/null || { echo "plot_timeline: gnuplot is not installed (Debian: gnuplot-nox)" >&2; exit 1; }
[ -r "$in" ] || { echo "plot_timeline: cannot read $in" >&2; exit 1; }

IFS=, read -r -a pols <<<"$policies"
[ ${#pols[@]} -ge 1 ] || usage
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# One space-separated file per policy; the sending nodes are the granted_node
# columns that are ever nonzero (the victim's own node never is).
for p in "${pols[@]}"; do
    awk -F, -v P="$p" 'NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
        $col["policy"] == P { $1 = $1; print }' OFS=' ' "$in" >"$dir/$p.dat"
    [ -s "$dir/$p.dat" ] || { echo "plot_timeline: no rows for policy $p in $in" >&2; exit 1; }
done
header=$(head -n 1 "$in")
IFS=, read -r -a cols <<<"$header"
node_cols=()
for i in "${!cols[@]}"; do
    case ${cols[$i]} in
        granted_node*)
            if awk -F, -v c=$((i + 1)) 'NR > 1 && $c > 0 { found = 1; exit } END { exit !found }' "$in"; then
                node_cols+=("$((i + 1)):${cols[$i]#granted_}")
            fi ;;
    esac
done
col() { local i; for i in "${!cols[@]}"; do [ "${cols[$i]}" = "$1" ] && { echo $((i + 1)); return; }; done; echo "plot_timeline: no column $1" >&2; exit 1; }
t=$(col elapsed_s) a=$(col arrivals_mbps) s=$(col recv_slots_in_use) q=$(col port_backlog_kb) d=$(col port_drops)
# The same y ranges in both columns, so that the policies compare at a glance.
max() { awk -v c="$1" '{ if ($c > m) m = $c } END { print (m > 0 ? m * 1.1 : 1) }' "$dir"/*.dat; }
amax=$(max "$a") smax=$(max "$s") qmax=$(max "$q") dmax=$(max "$d") gmax=1
for nc in "${node_cols[@]}"; do
    g=$(max "${nc%%:*}")
    gmax=$(awk -v a="$gmax" -v b="$g" 'BEGIN { print (b > a ? b : a) }')
done
tmax=$(awk -v c="$t" '{ if ($c > m) m = $c } END { print m }' "$dir"/*.dat)

ncol=${#pols[@]}
{
    echo "set terminal pngcairo size $((560 * ncol)),900 font 'sans,10'"
    echo "set output '$out'"
    echo "set multiplot layout 4,$ncol title \"$title\" noenhanced"
    echo "set grid"
    echo "set key top right noenhanced"
    echo "set xrange [0:$tmax]"
    echo "set linetype 1 lc rgb '#1f77b4' lw 1.5"
    echo "set linetype 2 lc rgb '#d62728' lw 1.5"
    echo "set linetype 3 lc rgb '#2ca02c' lw 1.5"
    echo "set linetype 4 lc rgb '#9467bd' lw 1.5"
    echo "set linetype 5 lc rgb '#ff7f0e' lw 1.5"
    for row in arrivals slots granted port; do
        for p in "${pols[@]}"; do
            f="$dir/$p.dat"
            echo "unset y2tics; unset y2label; set ytics mirror; unset arrow"
            case $row in
                arrivals)
                    echo "set title '$p: arrived per sample' noenhanced"
                    echo "set ylabel 'Mbit/s'; set yrange [0:$amax]"
                    [ -n "$ref" ] && echo "set arrow from graph 0, first $ref to graph 1, first $ref nohead dt 2 lc rgb 'gray40'"
                    echo "plot '$f' using $t:$a with steps lt 1 notitle" ;;
                slots)
                    echo "set title '$p: receive slots in use' noenhanced"
                    echo "set ylabel 'slots'; set yrange [0:$smax]"
                    echo "plot '$f' using $t:$s with steps lt 3 notitle" ;;
                granted)
                    echo "set title '$p: credits outstanding per sending node' noenhanced"
                    echo "set ylabel 'credits'; set yrange [0:$gmax]"
                    plot=''
                    k=1
                    for nc in "${node_cols[@]}"; do
                        plot+="${plot:+, }'$f' using $t:${nc%%:*} with steps lt $k title '${nc#*:}'"
                        k=$((k + 1))
                    done
                    echo "plot ${plot:-0 notitle}" ;;
                port)
                    echo "set title '$p: victim port queue and drops' noenhanced"
                    echo "set xlabel 'time since the start (s)'"
                    echo "set ylabel 'queue (KB)'; set yrange [0:$qmax]"
                    echo "set y2label 'drops since the start'; set y2range [0:$dmax]; set y2tics; set ytics nomirror"
                    echo "plot '$f' using $t:$q with steps lt 4 title 'queue', '' using $t:$d axes x1y2 with lines lt 2 title 'drops'"
                    echo "unset xlabel" ;;
            esac
        done
    done
    echo "unset multiplot"
} | gnuplot
echo "plot: $out"
