#!/usr/bin/env bash
# Draws the goodput per flow-control policy from a mailrail_incast CSV as an
# SVG bar chart (median over trials, each trial as a dot). Needs only awk.
#
# Usage: tools/plot_incast.sh incast.csv [out.svg]
set -euo pipefail
csv=$1
out=${2:-${csv%.csv}.svg}

awk -F, '
NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
{
    p = $col["policy"]; g = $col["goodput_gbps"] + 0
    if (!(p in n)) order[++np] = p
    v[p, ++n[p]] = g
    if (g > max) max = g
    ranks = $col["ranks"]; victims = $col["victims"]; bytes = $col["bytes"]; msgs = $col["messages_per_rank"]
}
function median(p,   i, j, t, a, k) {
    k = n[p]; for (i = 1; i <= k; i++) a[i] = v[p, i]
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
}
END {
    if (np == 0) { print "plot_incast: no rows in the CSV" > "/dev/stderr"; exit 1 }
    W = 560; H = 360; L = 70; B = 300; T = 50; bw = 80; gap = (W - L - 20 - np * bw) / (np + 1)
    top = max * 1.15; if (top <= 0) top = 1
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    printf "<text x=\"%d\" y=\"22\" font-size=\"15\" text-anchor=\"middle\">Incast goodput per flow-control policy</text>\n", W / 2
    printf "<text x=\"%d\" y=\"40\" text-anchor=\"middle\" fill=\"#555\">%d ranks, %d victim(s), %d messages of %d bytes per rank</text>\n", W / 2, ranks, victims, msgs, bytes
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, B, W - 20, B
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, T, L, B
    for (t = 0; t <= 4; t++) {
        y = B - (B - T) * t / 4
        printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, W - 20, y
        printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, y + 4, top * t / 4
    }
    printf "<text x=\"18\" y=\"%d\" transform=\"rotate(-90 18 %d)\" text-anchor=\"middle\">goodput (Gb/s)</text>\n", (B + T) / 2, (B + T) / 2
    split("#888888 #3b7dd8 #e07b28", colour, " ")
    for (i = 1; i <= np; i++) {
        p = order[i]; m = median(p); x = L + gap + (i - 1) * (bw + gap); h = (B - T) * m / top
        printf "<rect x=\"%.1f\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"/>\n", x, B - h, bw, h, colour[(i - 1) % 3 + 1]
        printf "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.3f</text>\n", x + bw / 2, B - h - 6, m
        printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x + bw / 2, B + 18, p
        for (k = 1; k <= n[p]; k++)
            printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"black\" opacity=\"0.6\"/>\n", x + bw / 2 + (k - (n[p] + 1) / 2) * 8, B - (B - T) * v[p, k] / top
    }
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#555\">bars: median of trials; dots: trials</text>\n", W / 2, B + 40
    print "</svg>"
}' "$csv" > "$out"
echo "plot_incast: wrote $out"
