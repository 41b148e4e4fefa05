#!/usr/bin/env bash
# The paper's incast experiments on the emulated fabric (tools/fabric/fabric.sh):
# every trial of every policy is its own MPI job, the policies interleaved
# within each trial, so that each job gets the switch port's own counters.
# Writes one CSV row per job, a summary CSV per experiment, a PNG plot
# (gnuplot), and prints the summary table. Needs root, like fabric.sh.
#
#   tools/fabric/incast_sweep.sh [options] EXPERIMENT...
#
# Experiments:
#   ratio      senders per victim 1, 2, 4, 8, 16 (--ratios), fixed data per sender:
#              goodput, speedup over none, port drops, the victim's peak memory
#   workload   16:1, data per sender from MESSAGES/8 doubled three times: runtime
#   victims    four victim hosts, 16 senders each (every sender picks victims at random)
#   timeline   16:1, the victim's received rate every 10 ms, one trial per policy
#   deep       16:1 with a deep (4 MB) port buffer, for contrast
#   ucx        the ratio sweep over UCX's TCP transport instead of the TCP substrate
#   quick      the demo's short ratio sweep: 1, 4, 16, two trials, fewer messages
#   all        ratio workload victims timeline deep ucx
#
# Options:
#   -o DIR         output directory (default build/incast)
#   -t TRIALS      trials per policy (default 5)
#   -m MESSAGES    messages per sender (default 1000)
#   -b BYTES       message size (default 4096)
#   -p POLICIES    comma-separated (default none,rank,node)
#   --ratios LIST  senders per victim for ratio/ucx (default "1 2 4 8 16"; 1-4, or a
#                  multiple of 4 up to 64: four sender hosts of ratio/4 ranks)
#   --build DIR    the meson build directory (default build)
#   --rate RATE    the line rate (default 200mbit); --buffer SIZE the victim port (32kb)
#   --spin         ranks spin in mr_receive() when idle (the paper's benchmark as it is)
#                  instead of waiting in mr_wait(): 2 cores then starve; results get "_spin"
#   --static       static grants, all at once, as before adaptive grants (and in the
#                  paper): MAILRAIL_NODE_CREDITS = 1024 / nodes, MAILRAIL_RANK_CREDITS =
#                  1024 / ranks (the receive pool divided evenly); results get "_static"
#
# Sender hosts hold the senders (one per host up to 4, then four hosts), every
# victim host holds one rank only, so that all traffic to a victim crosses its
# switch port. Ranks wait (mr_wait) instead of spinning when idle (incast -w):
# 2 cores run up to 68 ranks. docs/incast.md has the results and their reading.

# --- Inside fabric.sh (sourced by --script with --jobs): one layout's jobs. ---
sweep_jobs() {
    local exp=$1 substrate=$2 ratio=$3 victims=$4 messages=$5 trials=$6 policies=$7
    local bytes=$8 results=$9 tmp=${10} buffer=${11} build=${12} wait=${13} extra=${14:-}
    local trial policy label row counters=$tmp/counters.csv
    fabric_substrate "$substrate"
    for ((trial = 1; trial <= trials; trial++)); do
        for policy in ${policies//,/ }; do
            label="$exp-$substrate-$ratio-$policy-$trial"
            rm -f "$tmp/incast.csv"
            # shellcheck disable=SC2086
            fabric_run "$label" "$build/tools/mailrail_incast" -V @VICTIMS@ -m "$messages" \
                -b "$bytes" -t 1 -p "$policy" -s "$trial" $wait -q -c "$tmp/incast.csv" $extra \
                >"$tmp/job.out" 2>&1 || { cat "$tmp/job.out" >&2; return 1; }
            grep -E "port h|elsewhere" "$tmp/job.out" | sed 's/^/  /'
            # The job's row, joined with its ports' counters (summed over victim hosts).
            row=$(tail -n 1 "$tmp/incast.csv")
            awk -F, -v l="$label" '$1 == l { b += $3; d += $5 } END { print b + 0, d + 0 }' \
                "$counters" | {
                read -r port_bytes drops
                awk -F, -v row="$row" -v e="$exp" -v s="$substrate" -v buf="$buffer" \
                    -v r="$ratio" -v pb="$port_bytes" -v d="$drops" -v tr="$trial" 'BEGIN {
                    split(row, c, ",")
                    # policy,trial,ranks,nodes,victims,bytes,messages_per_rank,seconds,
                    # goodput_gbps,victim_peak_recv_slots,victim_peak_rss_kb,credit_returns,...
                    printf "%s,%s,%s,%d,%d,%d,%d,%s,%d,%.6f,%.2f,%.2f,%d,%d,%d,%d\n", e, s, buf, r,
                        c[5], c[7], c[6], c[1], tr, c[8], c[9] * 1000, pb * 8 / c[8] / 1e6, d,
                        c[10], c[11], c[12]
                }' >>"$results"
            }
        done
    done
}
if [ "${1:-}" = "--jobs" ]; then
    shift
    sweep_jobs "$@"
    return $?
fi

# --- The driver. ---
set -euo pipefail
usage() { sed -n '2,39p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=build/incast trials=5 messages=1000 bytes=4096 policies=none,rank,node
ratios="1 2 4 8 16" build=build rate=200mbit buffer=32kb exps=() static=0 wait=-w
while [ $# -gt 0 ]; do
    case $1 in
        -o) out=$2; shift 2 ;;
        -t) trials=$2; shift 2 ;;
        -m) messages=$2; shift 2 ;;
        -b) bytes=$2; shift 2 ;;
        -p) policies=$2; shift 2 ;;
        --ratios) ratios=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --buffer) buffer=$2; shift 2 ;;
        --static) static=1; shift ;;
        --spin) wait=; shift ;;
        -h|--help) usage ;;
        -*) echo "incast_sweep: unknown option $1" >&2; usage ;;
        *) exps+=("$1"); shift ;;
    esac
done
[ ${#exps[@]} -gt 0 ] || usage
[ "$(id -u)" -eq 0 ] || { echo "incast_sweep: needs root (network namespaces)" >&2; exit 1; }
build=$(cd "$build" && pwd)
[ -x "$build/tools/mailrail_incast" ] || { echo "incast_sweep: no $build/tools/mailrail_incast; build first" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
header="experiment,substrate,buffer,ratio,victims,messages_per_sender,bytes,policy,trial,seconds,goodput_mbps,port_mbps,port_drops,victim_peak_recv_slots,victim_peak_rss_kb,credit_returns"

# Runs one layout: RATIO senders per victim, VICTIMS victim hosts.
layout() {
    local exp=$1 substrate=$2 ratio=$3 victims=$4 msgs=$5 trl=$6 buf=$7 extra=${8:-}
    local results=${9:-$out/$1.csv} hosts ranks
    if [ "$ratio" -le 4 ]; then
        hosts=$((ratio + victims)) ranks=1
    else
        hosts=$((4 + victims)) ranks=$((ratio / 4))
    fi
    echo "== $exp: $ratio sender(s) per victim, $victims victim(s), $msgs x $bytes B per sender, $substrate, port buffer $buf"
    rm -f "$tmp/counters.csv"
    if [ "$static" = 1 ]; then
        export MAILRAIL_NODE_CREDITS=$((1024 / hosts))
        export MAILRAIL_RANK_CREDITS=$((1024 / ((hosts - victims) * ranks + victims)))
    fi
    "$here/fabric.sh" -q -H "$hosts" -R "$ranks" -V "$victims" --victim-ranks 1 \
        --rate "$rate" --buffer "$buf" --substrate "$substrate" --timeout 600 \
        --total-timeout 3000 --counters "$tmp/counters.csv" \
        --script "$0" --jobs "$exp" "$substrate" "$ratio" "$victims" "$msgs" "$trl" \
        "$policies" "$bytes" "$results" "$tmp" "$buf" "$build" "$wait" "$extra"
}

# Median, min and max of goodput and runtime per (x, policy), speedup over the first policy.
summarize() {
    local exp=$1 xcol=$2
    awk -F, -v X="$xcol" '
    NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
    {
        x = $col[X]; p = $col["policy"]; k = x SUBSEP p
        if (!(x in seenx)) { xs[++nx] = x; seenx[x] = 1 }
        if (!(p in seenp)) { ps[++np] = p; seenp[p] = 1 }
        n[k]++; g[k, n[k]] = $col["goodput_mbps"]; s[k, n[k]] = $col["seconds"]
        d[k, n[k]] = $col["port_drops"]; if ($col["victim_peak_recv_slots"] > slots[k]) slots[k] = $col["victim_peak_recv_slots"]
        if ($col["victim_peak_rss_kb"] > rss[k]) rss[k] = $col["victim_peak_rss_kb"]
        data[k] = $col["messages_per_sender"] * $col["bytes"] * $col["ratio"] / 1048576
    }
    function sort(a, m,   i, j, t) { for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    END {
        print X ",policy,trials,goodput_median_mbps,goodput_min_mbps,goodput_max_mbps,seconds_median,seconds_min,seconds_max,speedup_over_" ps[1] ",port_drops_median,victim_peak_recv_slots,victim_peak_rss_kb,data_per_victim_mib"
        for (i = 1; i <= nx; i++) for (j = 1; j <= np; j++) {
            k = xs[i] SUBSEP ps[j]; m = n[k]; if (!m) continue
            delete a; for (t = 1; t <= m; t++) a[t] = g[k, t]; sort(a, m); gm = med(a, m); glo = a[1]; ghi = a[m]
            delete b; for (t = 1; t <= m; t++) b[t] = s[k, t]; sort(b, m); sm[k] = med(b, m); slo = b[1]; shi = b[m]
            delete c; for (t = 1; t <= m; t++) c[t] = d[k, t]; sort(c, m)
            base = xs[i] SUBSEP ps[1]
            if (!(base in sm)) { delete e; for (t = 1; t <= n[base]; t++) e[t] = s[base, t]; sort(e, n[base]); sm[base] = med(e, n[base]) }
            printf "%s,%s,%d,%.1f,%.1f,%.1f,%.3f,%.3f,%.3f,%.2f,%d,%d,%d,%.1f\n", xs[i], ps[j], m, gm, glo, ghi, sm[k], slo, shi, sm[base] / sm[k], med(c, m), slots[k], rss[k], data[k]
        }
    }' "$out/$exp.csv" >"$out/${exp}_summary.csv"
    # The table, columns aligned (awk: `column` is not on every Debian machine).
    awk -F, '{ for (i = 1; i <= NF; i++) { c[NR, i] = $i; if (length($i) > w[i]) w[i] = length($i) }
               if (NF > nf) nf = NF }
         END { for (r = 1; r <= NR; r++) { for (i = 1; i <= nf; i++) printf "%-*s ", w[i], c[r, i]; print "" } }' \
        "$out/${exp}_summary.csv"
}

line_rate=$(awk -v r="$rate" 'BEGIN { v = r + 0; if (r ~ /gbit/) v *= 1000; else if (r ~ /kbit/) v /= 1000; print v }')
ratio_sweep() {
    local exp=$1 substrate=$2 list=$3 msgs=$4 trl=$5
    echo "$header" >"$out/$exp.csv"
    for r in $list; do layout "$exp" "$substrate" "$r" 1 "$msgs" "$trl" "$buffer"; done
    summarize "$exp" ratio
    "$root/tools/plot/plot_lines.sh" -i "$out/${exp}_summary.csv" -o "$out/$exp.png" -x ratio \
        -y goodput_median_mbps -l goodput_min_mbps -u goodput_max_mbps -g policy -L \
        -t "Incast on the emulated fabric ($substrate, $rate port, $buffer buffer): median of $trl trials, bars min-max" \
        -X "senders per victim (incast ratio)" -Y "goodput at the victim (Mbit/s)" \
        -r "$line_rate:line rate $rate"
    "$root/tools/plot/plot_lines.sh" -i "$out/${exp}_summary.csv" -o "$out/${exp}_drops.png" -x ratio \
        -y port_drops_median -g policy -L \
        -t "Packets the victim's switch port dropped ($substrate, $rate, $buffer): median of $trl trials" \
        -X "senders per victim (incast ratio)" -Y "packets dropped per run"
}

expanded=()
for exp in "${exps[@]}"; do
    if [ "$exp" = all ]; then expanded+=(ratio workload victims timeline deep ucx); else expanded+=("$exp"); fi
done
for name in "${expanded[@]}"; do
    exp=$name
    [ "$static" = 1 ] && exp=${exp}_static
    [ -z "$wait" ] && exp=${exp}_spin
    case $name in
        ratio) ratio_sweep "$exp" tcp "$ratios" "$messages" "$trials" ;;
        ucx) ratio_sweep "$exp" ucx "$ratios" "$messages" "$trials" ;;
        quick) ratio_sweep "$exp" tcp "1 4 16" $((messages / 3)) 2 ;;
        workload)
            echo "$header" >"$out/$exp.csv"
            for f in 1 2 4 8; do layout "$exp" tcp 16 1 $((messages * f / 8)) "$trials" "$buffer"; done
            # Data per victim, from the rows themselves.
            awk -F, 'NR == 1 { print "data_per_victim_mib," $0; next }
                { printf "%.1f,%s\n", $6 * $7 * $4 / 1048576, $0 }' "$out/$exp.csv" >"$tmp/w.csv"
            cp "$tmp/w.csv" "$out/$exp.csv"
            summarize "$exp" data_per_victim_mib
            "$root/tools/plot/plot_lines.sh" -i "$out/${exp}_summary.csv" -o "$out/$exp.png" \
                -x data_per_victim_mib -y seconds_median -l seconds_min -u seconds_max -g policy \
                -t "Runtime against data per victim, 16:1 on the emulated fabric ($rate, $buffer): median of $trials, bars min-max" \
                -X "data per victim (MiB)" -Y "runtime (s)" ;;
        victims)
            echo "$header" >"$out/$exp.csv"
            layout "$exp" tcp 16 4 "$messages" "$trials" "$buffer"
            summarize "$exp" ratio
            "$root/tools/plot/plot_incast.sh" "$out/$exp.csv" "$out/$exp.png" \
                "Four victims on the emulated fabric ($rate, $buffer): goodput over all victims" ;;
        deep)
            echo "$header" >"$out/$exp.csv"
            layout "$exp" tcp 16 1 "$messages" "$trials" 4mb
            summarize "$exp" ratio
            "$root/tools/plot/plot_incast.sh" "$out/$exp.csv" "$out/$exp.png" \
                "16:1 through a deep (4 MB) port buffer ($rate)" ;;
        timeline)
            echo "$header" >"$out/${exp}_runs.csv"
            rm -f "$tmp"/tl.*
            layout "$exp" tcp 16 1 "$messages" 1 "$buffer" "-i 10 -o $tmp/tl" "$out/${exp}_runs.csv"
            # The victim is the last rank (16): its received bytes per 10 ms sample.
            echo "policy,elapsed_s,received_mbps" >"$out/$exp.csv"
            for p in ${policies//,/ }; do
                awk -F, -v p="$p" 'NR > 1 { if (n++) printf "%s,%.3f,%.2f\n", p, $2, ($6 - b) * 8 / ($2 - t) / 1e6; t = $2; b = $6 }' \
                    "$tmp/tl.$p.0.16.csv" >>"$out/$exp.csv"
            done
            "$root/tools/plot/plot_lines.sh" -i "$out/$exp.csv" -o "$out/$exp.png" -x elapsed_s \
                -y received_mbps -g policy -s -r "$line_rate:line rate $rate" \
                -t "Received at the victim every 10 ms, 16:1 on the emulated fabric ($rate, $buffer)" \
                -X "time since the start (s)" -Y "received (Mbit/s)" ;;
        *) echo "incast_sweep: unknown experiment $exp" >&2; usage ;;
    esac
    echo "CSV: $out/$exp.csv"
done
