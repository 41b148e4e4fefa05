#!/usr/bin/env bash
# Draws clustered bars from a CSV file with gnuplot: one cluster per category
# (a cell of tools/fabric/incast_matrix.sh, say), one bar per value of a group
# column (a policy) in each, optionally with error bars, and optionally
# horizontal reference lines (the line rate, a target). PNG or SVG by the
# output's extension.
#
#   tools/plot/plot_bars.sh -i IN.csv -o OUT.png -c COL[,COL...] -y YCOL -g GROUPCOL
#       [-l LOWCOL -u HIGHCOL] [-t TITLE] [-Y YLABEL] [-r VALUE:LABEL]... [-G]
#
#   -c     the columns whose values, joined by spaces, name a category (its x label)
#   -l/-u  columns with the low and high ends of an error bar (min and max)
#   -r     a horizontal reference line at VALUE, labelled LABEL (may be repeated)
#   -G     logarithmic y axis (base 10)
# Categories and groups keep the order they first appear in; a group missing
# from a category leaves a gap.
set -euo pipefail

usage() { sed -n '2,17p' "$0" >&2; exit 2; }
in='' out='' cats='' y='' g='' lo='' hi='' title='' ylabel='' logy=0 refs=()
while getopts "i:o:c:y:g:l:u:t:Y:r:G" c; do
    case $c in
        i) in=$OPTARG ;; o) out=$OPTARG ;; c) cats=$OPTARG ;; y) y=$OPTARG ;; g) g=$OPTARG ;;
        l) lo=$OPTARG ;; u) hi=$OPTARG ;; t) title=$OPTARG ;; Y) ylabel=$OPTARG ;;
        r) refs+=("$OPTARG") ;; G) logy=1 ;; *) usage ;;
    esac
done
[ -n "$in" ] && [ -n "$out" ] && [ -n "$cats" ] && [ -n "$y" ] && [ -n "$g" ] || usage
{ [ -z "$lo" ] && [ -z "$hi" ]; } || { [ -n "$lo" ] && [ -n "$hi" ]; } || usage
command -v gnuplot >/dev/null || { echo "plot_bars: gnuplot is not installed (Debian: gnuplot-nox)" >&2; exit 1; }
[ -r "$in" ] || { echo "plot_bars: cannot read $in" >&2; exit 1; }

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# One row per category: its label, then per group "y low high" (or "?" for none).
# Prints the number of categories, then the groups' names.
read -r ncats groups < <(awk -F, -v C="$cats" -v Y="$y" -v G="$g" -v LO="$lo" -v HI="$hi" -v out="$data" '
NR == 1 {
    for (i = 1; i <= NF; i++) col[$i] = i
    nc = split(C, cc, ",")
    split(Y " " G (LO != "" ? " " LO " " HI : ""), need, " ")
    for (k = 1; k <= nc; k++) need["c" k] = cc[k]
    for (k in need) if (!(need[k] in col)) { print "plot_bars: no column " need[k] > "/dev/stderr"; exit 3 }
    next
}
$col[Y] != "" {
    label = $col[cc[1]]; for (k = 2; k <= nc; k++) label = label " " $col[cc[k]]
    key = $col[G]
    if (!(label in seenc)) { cat[++ncat] = label; seenc[label] = 1 }
    if (!(key in seeng)) { grp[++ngrp] = key; seeng[key] = 1 }
    v[label, key] = $col[Y]
    if (LO != "") { l[label, key] = $col[LO]; h[label, key] = $col[HI] }
}
END {
    for (i = 1; i <= ncat; i++) {
        row = "\"" cat[i] "\""
        for (j = 1; j <= ngrp; j++) {
            k = cat[i] SUBSEP grp[j]
            if (!(k in v)) row = row " ? ? ?"
            else if (LO != "") row = row " " v[k] " " l[k] " " h[k]
            else row = row " " v[k] " " v[k] " " v[k]
        }
        print row > out
    }
    names = ""; for (j = 1; j <= ngrp; j++) names = names (j > 1 ? " " : "") grp[j]
    print ncat + 0, names
}' "$in")
[ "${ncats:-0}" -gt 0 ] || { echo "plot_bars: no rows in $in" >&2; exit 1; }
read -r -a names <<<"$groups"

# Wide enough for every bar: about 16 pixels a bar.
width=$((160 + ncats * (${#names[@]} + 1) * 16))
[ "$width" -ge 900 ] || width=900
case $out in
    *.svg) term="svg size $width,560 dynamic font 'sans,12' background rgb 'white'" ;;
    *) term="pngcairo size $width,620 font 'sans,11'" ;;
esac
{
    echo "set terminal $term"
    echo "set output '$out'"
    echo "set datafile separator ' '"
    echo "set datafile missing '?'"
    echo "set title \"$title\" noenhanced"
    echo "set ylabel \"$ylabel\" noenhanced"
    echo "set key outside right top noenhanced"
    echo "set grid ytics"
    echo "set style data histogram"
    echo "set style histogram errorbars gap 1 lw 1"
    echo "set style fill solid 0.7 border -1"
    echo "set boxwidth 0.9"
    echo "set xtics rotate by -40 left noenhanced"
    echo "set bmargin 8"
    echo "set linetype 1 lc rgb '#d62728'"
    echo "set linetype 2 lc rgb '#1f77b4'"
    echo "set linetype 3 lc rgb '#2ca02c'"
    if [ "$logy" = 1 ]; then echo "set logscale y 10"; else echo "set yrange [0:*]"; fi
    top=0
    for r in "${refs[@]}"; do
        echo "set arrow from graph 0, first ${r%%:*} to graph 1, first ${r%%:*} nohead dt 2 lc rgb 'gray40' lw 1.5"
        echo "set label \"${r#*:}\" at graph 0.005, first ${r%%:*} offset 0,0.6 tc rgb 'gray30' noenhanced"
        top=$(awk -v a="$top" -v b="${r%%:*}" 'BEGIN { print (b > a ? b : a) }')
    done
    [ "$logy" = 1 ] || [ "$top" = 0 ] || echo "set yrange [0:$(awk -v t="$top" 'BEGIN { print t * 1.12 }')<*]"
    plot="plot"
    for i in "${!names[@]}"; do
        using="$((2 + 3 * i)):$((3 + 3 * i)):$((4 + 3 * i))"
        if [ "$i" -eq 0 ]; then using+=":xtic(1)"; else plot+=","; fi
        plot+=" '$data' using $using title '${names[$i]}'"
    done
    echo "$plot"
} | gnuplot
echo "plot: $out"
