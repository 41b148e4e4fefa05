# Summaries of the workload tools' CSVs (mailrail_moe -c, mailrail_gnn -c),
# sourced by tools/fabric/workload_sweep.sh and tools/workload_host.sh.

# Median, min and max per (point, contender), and the ratio to alltoallv's median.
# KEYS: the columns that make a point.
summarize() {
    local csv=$1 keys=$2
    awk -F, -v K="$keys" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; nk = split(K, key, " "); next }
    {
        x = ""; for (i = 1; i <= nk; i++) x = x (i > 1 ? "," : "") $col[key[i]]
        c = $col["contender"]; k = x SUBSEP c
        if (!(x in seenx)) { xs[++nx] = x; seenx[x] = 1 }
        if (!(c in seenc)) { cs[++nc] = c; seenc[c] = 1 }
        n[k]++; s[k, n[k]] = $col["seconds"]; d[k, n[k]] = $col["port_drops"]
        # CPU and credit returns of the timed step, all ranks (MoE; empty where a tool lacks them).
        u[k, n[k]] = ("cpu_s" in col) ? $col["cpu_s"] : ""
        r[k, n[k]] = ("credit_returns" in col) ? $col["credit_returns"] : ""
        if ($col["hottest_mib"] > hot[k]) hot[k] = $col["hottest_mib"]
    }
    function sort(a, m,   i, j, t) { for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    # The median of v[k, 1..m], or empty when the tool did not write that column.
    function colmed(v, k, m,   t, g) { if (v[k, 1] == "") return ""; for (t = 1; t <= m; t++) g[t] = v[k, t]; sort(g, m); return med(g, m) }
    END {
        h = ""; for (i = 1; i <= nk; i++) h = h key[i] ","
        print h "contender,trials,seconds_median,seconds_min,seconds_max,of_alltoallv,port_drops_median,hottest_mib,cpu_s_median,credit_returns_median"
        for (i = 1; i <= nx; i++) {
            b = xs[i] SUBSEP "alltoallv"; base = 0
            if (n[b]) base = colmed(s, b, n[b])
            for (j = 1; j <= nc; j++) {
                k = xs[i] SUBSEP cs[j]; m = n[k]; if (!m) continue
                delete a; for (t = 1; t <= m; t++) a[t] = s[k, t]; sort(a, m)
                ratio = (base > 0) ? sprintf("%.2f", med(a, m) / base) : ""
                printf "%s,%s,%d,%.4f,%.4f,%.4f,%s,%d,%.1f,%s,%s\n", xs[i], cs[j], m, med(a, m), a[1], a[m],
                    ratio, colmed(d, k, m), hot[k], colmed(u, k, m), colmed(r, k, m)
            }
        }
    }' "$csv"
}

# Prints a CSV as an aligned table.
table() {
    awk -F, '{ for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) }
               if (NF > nf) nf = NF }
         END { for (r = 1; r <= NR; r++) { for (i = 1; i <= nf; i++) printf "%-*s ", w[i], c[r, i]; print "" } }' "$1"
}
