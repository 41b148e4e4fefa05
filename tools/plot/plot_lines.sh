#!/usr/bin/env bash
# Draws a line chart from a CSV file with gnuplot: one line per value of a
# group column (a policy, say), optionally with error bars, and optionally a
# horizontal reference line (the bottleneck's rate, say). PNG or SVG by the
# output's extension.
#
#   tools/plot/plot_lines.sh -i IN.csv -o OUT.png -x XCOL -y YCOL -g GROUPCOL
#       [-l LOWCOL -u HIGHCOL] [-t TITLE] [-X XLABEL] [-Y YLABEL]
#       [-r VALUE:LABEL] [-L] [-G] [-s]
#
#   -l/-u  columns with the low and high ends of an error bar (min and max)
#   -r     a horizontal reference line at VALUE, labelled LABEL
#   -L     logarithmic x axis (base 2)
#   -G     logarithmic y axis (base 2), for ratios far on both sides of the reference
#   -s     steps instead of points (timelines)
# Rows keep their order within a group; groups keep the order they first appear in.
set -euo pipefail

usage() { sed -n '2,16p' "$0" >&2; exit 2; }
in='' out='' x='' y='' g='' lo='' hi='' title='' xlabel='' ylabel='' ref='' logx=0 logy=0 steps=0
while getopts "i:o:x:y:g:l:u:t:X:Y:r:LGs" c; do
    case $c in
        i) in=$OPTARG ;; o) out=$OPTARG ;; x) x=$OPTARG ;; y) y=$OPTARG ;; g) g=$OPTARG ;;
        l) lo=$OPTARG ;; u) hi=$OPTARG ;; t) title=$OPTARG ;; X) xlabel=$OPTARG ;;
        Y) ylabel=$OPTARG ;; r) ref=$OPTARG ;; L) logx=1 ;; G) logy=1 ;; s) steps=1 ;; *) usage ;;
    esac
done
[ -n "$in" ] && [ -n "$out" ] && [ -n "$x" ] && [ -n "$y" ] && [ -n "$g" ] || usage
command -v gnuplot >/dev/null || { echo "plot_lines: gnuplot is not installed (Debian: gnuplot-nox)" >&2; exit 1; }
[ -r "$in" ] || { echo "plot_lines: cannot read $in" >&2; exit 1; }

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# One data block per group, two blank lines apart, each headed by the group's name.
ngroups=$(awk -F, -v X="$x" -v Y="$y" -v G="$g" -v LO="$lo" -v HI="$hi" -v out="$data" '
NR == 1 {
    for (i = 1; i <= NF; i++) col[$i] = i
    split(X " " Y " " G (LO != "" ? " " LO " " HI : ""), need, " ")
    for (k in need) if (!(need[k] in col)) { print "plot_lines: no column " need[k] > "/dev/stderr"; exit 3 }
    next
}
{
    key = $col[G]
    if (!(key in n)) order[++ng] = key
    row = $col[X] " " $col[Y]
    if (LO != "") row = row " " $col[LO] " " $col[HI]
    rows[key, ++n[key]] = row
}
END {
    for (k = 1; k <= ng; k++) {
        if (k > 1) printf "\n\n" > out
        printf "\"%s\"\n", order[k] > out
        for (j = 1; j <= n[order[k]]; j++) print rows[order[k], j] > out
    }
    print ng
}' "$in")
[ "${ngroups:-0}" -gt 0 ] || { echo "plot_lines: no rows in $in" >&2; exit 1; }

case $out in
    *.svg) term="svg size 800,500 dynamic font 'sans,12' background rgb 'white'" ;;
    *) term="pngcairo size 900,560 font 'sans,11'" ;;
esac
if [ -n "$lo" ]; then
    style="using 1:2:3:4 with yerrorlines"
elif [ "$steps" = 1 ]; then
    style="using 1:2 with steps"
else
    style="using 1:2 with linespoints"
fi
{
    echo "set terminal $term"
    echo "set output '$out'"
    echo "set datafile separator ' '"
    echo "set title \"$title\" noenhanced"
    echo "set xlabel \"$xlabel\" noenhanced"
    echo "set ylabel \"$ylabel\" noenhanced"
    echo "set key outside right top noenhanced"
    echo "set grid"
    echo "set yrange [0:*]"
    echo "set offsets graph 0.03, graph 0.03, graph 0.08, 0"
    echo "set linetype 1 lc rgb '#d62728' lw 2 pt 7"
    echo "set linetype 2 lc rgb '#1f77b4' lw 2 pt 5"
    echo "set linetype 3 lc rgb '#2ca02c' lw 2 pt 9"
    [ "$logx" = 1 ] && echo "set logscale x 2"
    [ "$steps" = 1 ] && echo "set xrange [0:*]" && echo "set offsets 0, 0, graph 0.08, 0"
    if [ "$logy" = 1 ]; then
        # Autoscaled both ways, but always showing 0.5 to twice the reference (or to 2).
        top=$(awk -v r="${ref%%:*}" 'BEGIN { print (r != "" && r * 2 > 2) ? r * 2 : 2 }')
        echo "set logscale y 2"
        echo "set yrange [*<0.5:$top<*]"
    elif [ -n "$ref" ]; then
        echo "set yrange [0:${ref%%:*} * 1.15]"
    fi
    if [ -n "$ref" ]; then
        echo "set arrow from graph 0, first ${ref%%:*} to graph 1, first ${ref%%:*} nohead dt 2 lc rgb 'gray40' lw 1.5"
        echo "set label \"${ref#*:}\" at graph 0.01, first ${ref%%:*} offset 0,0.7 tc rgb 'gray30' noenhanced"
    fi
    echo "plot for [i=0:$((ngroups - 1))] '$data' index i $style title columnheader(1)"
} | gnuplot
echo "plot: $out"
