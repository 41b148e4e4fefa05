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
#   quick      the demo's run: 64:1 (250 messages per sender), three trials of each
#              policy, in about a minute
#   replot     the summary and figures again from OUT/NAME.csv (--name NAME), e.g.
#              after appending the rows of a separate run to it
#   paper      the paper's ratios 16, 64, 256, 1024 (--ratios): four sender hosts of
#              ratio/4 ranks, the same data per victim at every ratio (MESSAGES x 16 /
#              ratio messages per sender), goodput, drops, credit-return messages
#   all        ratio workload victims timeline deep ucx
#
# Options:
#   -o DIR         output directory (default build/incast)
#   -t TRIALS      trials per policy (default 5)
#   -m MESSAGES    messages per sender (default 1000)
#   -b BYTES       message size (default 4096)
#   -p POLICIES    comma-separated (default none,rank,node)
#   --ratios LIST  senders per victim for ratio/ucx (default "1 2 4 8 16") and paper
#                  (default "16 64 256 1024"), timeline (default 16): 1-4, or a multiple
#                  of 4 up to 1024 (four sender hosts of ratio/4 ranks)
#   --substrate S  tcp or ucx (UCX's TCP transport) for paper and timeline (default tcp)
#   --paper        the paper's settings instead of the defaults: MAILRAIL_RANK_CREDITS=8,
#                  MAILRAIL_NODE_CREDITS=512, MAILRAIL_CREDIT_RETURN_THRESHOLD=2,
#                  MAILRAIL_PIGGYBACK=yes; results get "_paper"
#   --build DIR    the meson build directory (default build)
#   --rate RATE    the line rate (default 200mbit); --buffer SIZE the victim port (32kb)
#   --spin         ranks spin in mr_receive() when idle (the paper's benchmark as it is)
#                  instead of waiting in mr_wait(): 2 cores then starve; results get "_spin"
#   --wait-ms MS   idle ranks sleep in mr_wait() up to MS ms at a time (default 1)
#   --launcher L   mpiexec (default: fabric.sh, MPICH's hydra) or srun: a Slurm
#                  cluster on the same hosts (tools/fabric/slurm.sh, which needs the
#                  Debian packages slurmctld slurmd slurm-client munge), each job
#                  `srun --mpi=pmi2` with the same placement; results get "_srun"
#                  (docs/launch.md)
#   --static       static grants, all at once, as before adaptive grants (and in the
#                  paper): MAILRAIL_NODE_CREDITS = 1024 / nodes, MAILRAIL_RANK_CREDITS =
#                  1024 / ranks (the receive pool divided evenly); results get "_static"
#
# Sender hosts hold the senders (one per host up to 4, then four hosts), every
# victim host holds one rank only, so that all traffic to a victim crosses its
# switch port. Ranks wait (mr_wait) instead of spinning when idle (incast -w):
# 2 cores run up to 68 ranks. docs/incast.md has the results and their reading.

# --- Inside fabric.sh (sourced by --script with --jobs): one layout's job. ---
# One MPI job runs every trial of every policy, interleaved (trial 0 of each
# policy, then trial 1, ...): starting hundreds of ranks costs minutes here, so
# it is paid once per layout; the incast tool reads the victim port's counters
# before and after each trial through $FABRIC_PORT_COUNTERS (-P).
port_sampler() {
    # The victim ports' counters every ~10 ms, with the wall clock, until killed.
    local out=$1
    echo "epoch_s,port_bytes,port_packets,port_drops,port_backlog_bytes" >"$out"
    while :; do
        echo "$EPOCHREALTIME $($FABRIC_PORT_COUNTERS)" | tr ' ' ',' >>"$out"
        sleep 0.01
    done
}
sweep_jobs() {
    local exp=$1 substrate=$2 ratio=$3 victims=$4 messages=$5 trials=$6 policies=$7
    local bytes=$8 results=$9 tmp=${10} buffer=${11} build=${12} wait=${13} extra=${14:-}
    local label="$exp-$substrate-$ratio" sampler='' rc=0
    fabric_substrate "$substrate"
    rm -f "$tmp/incast.csv"
    if [ -n "$extra" ]; then
        port_sampler "$tmp/port_samples.csv" &
        sampler=$!
    fi
    if [ -n "${SLURM_DIR:-}" ]; then
        # --launcher srun (inside tools/fabric/slurm.sh): the same placement as
        # fabric.sh's, rank by rank (srun --distribution=arbitrary).
        local r host
        for ((r = 0; r < FABRIC_RANKS; r++)); do
            if [ "$r" -lt "$FABRIC_SENDER_RANKS" ]; then
                host=$((r / FABRIC_RANKS_PER_HOST))
            else
                host=$((FABRIC_SENDER_HOSTS + (r - FABRIC_SENDER_RANKS) / FABRIC_VICTIM_RANKS_PER_HOST))
            fi
            echo "mrf-h$host"
        done >"$SLURM_DIR/hostfile"
        fabric_mark
        # shellcheck disable=SC2086
        SLURM_HOSTFILE=$SLURM_DIR/hostfile slurm_srun "$label" -n "$FABRIC_RANKS" \
            --distribution=arbitrary "$build/tools/mailrail_incast" -V "$FABRIC_VICTIM_RANKS" \
            -m "$messages" -b "$bytes" -t "$trials" -p "$policies" -s 1 $wait -q \
            -c "$tmp/incast.csv" -P "$FABRIC_PORT_COUNTERS" $extra >"$tmp/job.out" 2>&1 || rc=$?
        fabric_report "$label" >>"$tmp/job.out"
    else
        # shellcheck disable=SC2086
        fabric_run "$label" "$build/tools/mailrail_incast" -V @VICTIMS@ -m "$messages" \
            -b "$bytes" -t "$trials" -p "$policies" -s 1 $wait -q -c "$tmp/incast.csv" \
            -P "$FABRIC_PORT_COUNTERS" $extra >"$tmp/job.out" 2>&1 || rc=$?
    fi
    if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; fi
    [ "$rc" -eq 0 ] || { cat "$tmp/job.out" >&2; return 1; }
    grep -E "^mailrail_incast|elsewhere" "$tmp/job.out" | sed 's/^/  /'
    # policy,trial,ranks,nodes,victims,bytes,messages_per_rank,seconds,goodput_gbps,
    # victim_peak_recv_slots,victim_peak_rss_kb,credit_returns,deferred_sends,verified,
    # port_bytes,port_packets,port_drops,cpu_s,cpu_s_per_mib (the last two are empty from
    # an incast tool older than them)
    awk -F, -v e="$exp" -v s="$substrate" -v buf="$buffer" -v r="$ratio" 'NR > 1 {
        printf "%s,%s,%s,%d,%d,%d,%d,%s,%d,%.6f,%.2f,%.2f,%d,%d,%d,%d,%d,%s\n", e, s, buf, r,
            $5, $7, $6, $1, $2 + 1, $8, $9 * 1000, $15 * 8 / $8 / 1e6, $17, $10, $11, $12, $3, $19
    }' "$tmp/incast.csv" >>"$results"
}
if [ "${1:-}" = "--jobs" ]; then
    shift
    sweep_jobs "$@"
    return $?
fi

# --- The driver. ---
set -euo pipefail
usage() { sed -n '2,/^$/p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=build/incast trials=5 messages=1000 bytes=4096 policies=none,rank,node
replot='' ratios='' build=build rate=200mbit buffer=32kb exps=() static=0 wait=-w paper=0 substrate=tcp
launcher=mpiexec
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
        --paper) paper=1; shift ;;
        --name) replot=$2; shift 2 ;;
        --substrate) substrate=$2; shift 2 ;;
        --launcher) launcher=$2; shift 2 ;;
        --spin) wait=; shift ;;
        --wait-ms) wait="-W $2"; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "incast_sweep: unknown option $1" >&2; usage ;;
        *) exps+=("$1"); shift ;;
    esac
done
[ ${#exps[@]} -gt 0 ] || usage
case $substrate in tcp|ucx) ;; *) echo "incast_sweep: --substrate tcp or ucx" >&2; exit 2 ;; esac
case $launcher in mpiexec|srun) ;; *) echo "incast_sweep: --launcher mpiexec or srun" >&2; exit 2 ;; esac
for r in $ratios; do
    case $r in ''|*[!0-9]*) echo "incast_sweep: --ratios: '$r' is not a number" >&2; exit 2 ;; esac
    [ "$r" -ge 1 ] && { [ "$r" -le 4 ] || { [ $((r % 4)) -eq 0 ] && [ "$r" -le 1024 ]; }; } ||
        { echo "incast_sweep: --ratios: $r is not 1-4 or a multiple of 4 up to 1024" >&2; exit 2; }
done
if [ "$paper" = 1 ]; then
    export MAILRAIL_RANK_CREDITS=8 MAILRAIL_NODE_CREDITS=512 MAILRAIL_CREDIT_RETURN_THRESHOLD=2
    export MAILRAIL_PIGGYBACK=yes
fi
[ "$(id -u)" -eq 0 ] || { echo "incast_sweep: needs root (network namespaces)" >&2; exit 1; }
build=$(cd "$build" && pwd)
[ -x "$build/tools/mailrail_incast" ] || { echo "incast_sweep: no $build/tools/mailrail_incast; build first" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
header="experiment,substrate,buffer,ratio,victims,messages_per_sender,bytes,policy,trial,seconds,goodput_mbps,port_mbps,port_drops,victim_peak_recv_slots,victim_peak_rss_kb,credit_returns,ranks,cpu_s_per_mib"

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
    # Hundreds of ranks per core finish their collectives slowly (docs/scale.md).
    [ "$ratio" -ge 256 ] && export MAILRAIL_TIMEOUT=${MAILRAIL_TIMEOUT:-600}
    if [ "$static" = 1 ]; then
        export MAILRAIL_NODE_CREDITS=$((1024 / hosts))
        export MAILRAIL_RANK_CREDITS=$((1024 / ((hosts - victims) * ranks + victims)))
    fi
    # One job runs every trial: starting 1,025 ranks takes minutes on 2 cores, and
    # each trial starts MailRail afresh.
    local job_timeout=$((600 + (ratio * victims + 1) * (trl + 1)))
    local launch=("$here/fabric.sh" -R "$ranks")
    # slurm.sh: -C, each node's CPUs, is fabric.sh's -R.
    [ "$launcher" = srun ] && launch=("$here/slurm.sh" -C "$ranks")
    "${launch[@]}" -q -H "$hosts" -V "$victims" --victim-ranks 1 \
        --rate "$rate" --buffer "$buf" --substrate "$substrate" --timeout "$job_timeout" \
        --total-timeout $((job_timeout + 300)) --counters "$tmp/counters.csv" \
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
        cr[k, n[k]] = $col["credit_returns"]
        # CPU seconds of all ranks per MiB delivered; CSVs older than the column have none.
        if (("cpu_s_per_mib" in col) && $col["cpu_s_per_mib"] != "") { nc[k]++; cpu[k, nc[k]] = $col["cpu_s_per_mib"] }
    }
    function sort(a, m,   i, j, t) { for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } }
    function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
    END {
        print X ",policy,trials,goodput_median_mbps,goodput_min_mbps,goodput_max_mbps,seconds_median,seconds_min,seconds_max,speedup_over_" ps[1] ",port_drops_median,victim_peak_recv_slots,victim_peak_rss_kb,data_per_victim_mib,credit_returns_median,cpu_s_per_mib_median"
        for (i = 1; i <= nx; i++) for (j = 1; j <= np; j++) {
            k = xs[i] SUBSEP ps[j]; m = n[k]; if (!m) continue
            delete a; for (t = 1; t <= m; t++) a[t] = g[k, t]; sort(a, m); gm = med(a, m); glo = a[1]; ghi = a[m]
            delete b; for (t = 1; t <= m; t++) b[t] = s[k, t]; sort(b, m); sm[k] = med(b, m); slo = b[1]; shi = b[m]
            delete c; for (t = 1; t <= m; t++) c[t] = d[k, t]; sort(c, m)
            delete f; for (t = 1; t <= m; t++) f[t] = cr[k, t]; sort(f, m); crm = med(f, m)
            cm = ""; if (nc[k]) { delete h; for (t = 1; t <= nc[k]; t++) h[t] = cpu[k, t]; sort(h, nc[k]); cm = sprintf("%.4f", med(h, nc[k])) }
            base = xs[i] SUBSEP ps[1]
            if (!(base in sm)) { delete e; for (t = 1; t <= n[base]; t++) e[t] = s[base, t]; sort(e, n[base]); sm[base] = med(e, n[base]) }
            printf "%s,%s,%d,%.1f,%.1f,%.1f,%.3f,%.3f,%.3f,%.2f,%d,%d,%d,%.1f,%d,%s\n", xs[i], ps[j], m, gm, glo, ghi, sm[k], slo, shi, sm[base] / sm[k], med(c, m), slots[k], rss[k], data[k], crm, cm
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
    local exp=$1 substrate=$2 list=$3 msgs=$4 trl=$5 same_data=${6:-0} m
    echo "$header" >"$out/$exp.csv"
    for r in $list; do
        # paper: the same data per victim at every ratio (16 x MESSAGES messages).
        m=$msgs
        if [ "$same_data" = 1 ]; then m=$(((msgs * 16 + r / 2) / r)); [ "$m" -ge 1 ] || m=1; fi
        layout "$exp" "$substrate" "$r" 1 "$m" "$trl" "$buffer"
    done
    ratio_plots "$exp" "$substrate" "$trl"
}

# The summary and the figures of a ratio sweep's CSV ($out/EXP.csv).
ratio_plots() {
    local exp=$1 substrate=$2 trl=$3
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
    if [ "$(awk -F, 'NR > 1 && $16 > 0 { n++ } END { print n + 0 }' "$out/$exp.csv")" -gt 0 ]; then
        "$root/tools/plot/plot_lines.sh" -i "$out/${exp}_summary.csv" -o "$out/${exp}_returns.png" \
            -x ratio -y credit_returns_median -g policy -L -G \
            -t "Credit-return messages per run ($substrate, $rate, $buffer): median of $trl trials" \
            -X "senders per victim (incast ratio)" -Y "credit-return messages"
    fi
}

# Joins the victim's samples (rank RATIO, the last) of every policy with the port
# counters sampled beside them (by wall clock): arrivals per interval, slots in
# use, credits outstanding per sending node, the port's queue and its drops since
# the trial began.
timeline_join() {
    local ports=$1 victim=$2 p f first=1
    for p in ${policies//,/ }; do
        f="$tmp/tl.$p.0.$victim.csv"
        [ -r "$f" ] || { echo "incast_sweep: no samples $f" >&2; return 1; }
        awk -F, -v P="$p" -v first="$first" '
            FNR == 1 { file++ }
            file == 1 && FNR > 1 { pe[++np] = $1; pd[np] = $4; pq[np] = $5; next }
            file == 2 && FNR == 1 {
                for (i = 1; i <= NF; i++) col[$i] = i
                g = ""; for (i = 1; i <= NF; i++) if ($i ~ /^granted_node/) { gc[++ng] = i; g = g "," $i }
                if (first) print "policy,elapsed_s,arrivals_mbps,recv_slots_in_use,port_backlog_kb,port_drops" g
                next
            }
            file == 2 {
                e = $col["epoch_s"]
                while (j < np && pe[j + 1] <= e) j++
                if (d0 == "" && j > 0) d0 = pd[j]
                if (n++) {
                    line = sprintf("%s,%.3f,%.2f,%d,%.1f,%d", P, $col["elapsed_s"],
                        ($col["received_bytes"] - b) * 8 / ($col["elapsed_s"] - t) / 1e6,
                        $col["recv_slots_in_use"], j ? pq[j] / 1024 : 0, j ? pd[j] - d0 : 0)
                    for (k = 1; k <= ng; k++) line = line "," $gc[k]
                    print line
                }
                t = $col["elapsed_s"]; b = $col["received_bytes"]
            }' "$ports" "$f"
        first=0
    done
}

expanded=()
for exp in "${exps[@]}"; do
    if [ "$exp" = all ]; then expanded+=(ratio workload victims timeline deep ucx); else expanded+=("$exp"); fi
done
for name in "${expanded[@]}"; do
    exp=$name
    [ "$static" = 1 ] && exp=${exp}_static
    [ -z "$wait" ] && exp=${exp}_spin
    [ "$launcher" = srun ] && exp=${exp}_srun
    case $name in
        ratio) ratio_sweep "$exp" tcp "${ratios:-1 2 4 8 16}" "$messages" "$trials" ;;
        ucx) ratio_sweep "$exp" ucx "${ratios:-1 2 4 8 16}" "$messages" "$trials" ;;
        paper)
            exp=${exp/paper/paper_$substrate}
            [ "$paper" = 1 ] && exp=${exp}_paper
            ratio_sweep "$exp" "$substrate" "${ratios:-16 64 256 1024}" "$messages" "$trials" 1 ;;
        replot)
            # Summary and figures again from $out/NAME.csv (runs appended to it by hand).
            [ -n "$replot" ] && [ -r "$out/$replot.csv" ] ||
                { echo "incast_sweep: replot needs --name NAME with $out/NAME.csv" >&2; exit 2; }
            ratio_plots "$replot" "$(awk -F, 'NR == 2 { print $2 }' "$out/$replot.csv")" "$trials"
            exp=$replot ;;
        quick) ratio_sweep "$exp" tcp "64" "$messages" 3 1 ;;
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
            # Per ratio: one trial per policy with the victim's samples every 10 ms
            # (mailrail_incast -i) and the victim port's counters beside them.
            for r in ${ratios:-16}; do
                tl=${exp}_${substrate}_$r
                [ "$paper" = 1 ] && tl=${tl}_paper
                m=$(((messages * 16 + r / 2) / r)); [ "$m" -ge 1 ] || m=1
                echo "$header" >"$out/${tl}_runs.csv"
                rm -f "$tmp"/tl.* "$tmp/port_samples.csv"
                layout "$tl" "$substrate" "$r" 1 "$m" 1 "$buffer" "-i 10 -o $tmp/tl" "$out/${tl}_runs.csv"
                timeline_join "$tmp/port_samples.csv" "$r" >"$out/$tl.csv"
                "$root/tools/plot/plot_timeline.sh" -i "$out/$tl.csv" -o "$out/$tl.png" \
                    -p "$policies" -r "$line_rate" \
                    -t "The victim at $r:1 on the emulated fabric ($substrate, $rate, $buffer), samples every 10 ms"
                echo "CSV: $out/$tl.csv"
            done
            continue ;;
        *) echo "incast_sweep: unknown experiment $exp" >&2; usage ;;
    esac
    echo "CSV: $out/$exp.csv"
done
