#!/usr/bin/env bash
# The workloads MailRail exists for, against MPI_Alltoallv, on the emulated
# fabric (tools/fabric/fabric.sh): a Mixture-of-Experts step (mailrail_moe)
# and a GNN aggregation layer (mailrail_gnn). Four sender hosts and one host
# of hot experts (or hubs); MPICH's own traffic crosses the fabric too
# (fabric.sh --mpi-net), so that the baseline goes through the same shaped
# switch port. One MPI job per point runs every contender, interleaved trial
# by trial, each trial reading the port's counters (-P). Writes one CSV row per
# trial, a summary CSV (median, min, max, ratio to alltoallv), PNG plots, and
# prints the summary. Needs root, like fabric.sh.
#
#   tools/fabric/workload_sweep.sh [options] EXPERIMENT...
#
# Experiments:
#   moe        the skew sweep (--skews) at one size (--ranks, the first), hot experts
#              on the victim host and, for contrast, spread over all hosts
#   moe-ranks  s = 1.0 with hot experts at every size of --ranks
#   gnn        the GNN layer on R-MAT graphs of --scales, hubs wherever they fall
#   quick      moe at s = 0 and 1.0, hot and spread, 64 ranks, 3 trials: about ten
#              minutes here
#
# Options:
#   -o DIR           output directory (default build/workloads)
#   -t TRIALS        trials per contender (default 3)
#   -p CONTENDERS    default alltoallv,none,rank,node,node+h
#   --ranks LIST     ranks in all, 4 on the victim host and the rest on 4 sender hosts:
#                    a multiple of 4 from 8 (default "64"; moe-ranks "64 256 1024")
#   --skews LIST     Zipf skews for moe (default "0 0.6 1.0 1.4")
#   --tokens N       tokens in all per step: each rank holds N / ranks (default 1024)
#   --hidden BYTES   bytes per token (default 7168)
#   --scales LIST    R-MAT scales for gnn (default "12 14")
#   --features F     floats per vertex for gnn (default 128)
#   --substrate S    tcp (default) or ucx (UCX's TCP transport)
#   --build DIR      the meson build directory (default build)
#   --rate RATE      the line rate (default 200mbit); --buffer SIZE the victim port (32kb)
#   --wait-ms MS     idle ranks sleep up to MS ms at a time in mr_wait() (default 100;
#                    a message, a credit or a free send buffer wakes them sooner); MPI
#                    tests its nonblocking collectives with naps of 1 ms at most
#   --warmup N       MoE: untimed steps before each timed one (default 1; MailRail's
#                    first steps after mr_init() are slower, docs/workloads.md)
#   --no-pack        MailRail's MoE contenders send a datagram per token (or piece of
#                    one) instead of packing tokens into datagrams (mailrail_moe --pack)
#   --datagram SIZE  MAILRAIL_DATAGRAM_SIZE (default 32K up to 128 ranks, 16K up to
#                    256, then 4K: each rank's 1,024 receive slots, and more under rank,
#                    are that large, and 1,024 ranks x 1,024 x 32 KiB would not fit)
#   --no-mpi-net     leave MPICH's traffic on shared memory (it then bypasses the
#                    fabric: only for contrast)
#
# docs/workloads.md has the results and their reading.

# --- Inside fabric.sh (sourced by --script with --jobs): one layout's jobs. ---
if [ "${1:-}" = "--jobs" ]; then
    shift
    sweep_jobs() {
        local tool=$1 substrate=$2 tmp=$3 results=$4 prefix=$5
        shift 5
        local label rc=0 spec args
        fabric_substrate "$substrate"
        # Each remaining argument is one job: "LABEL|ARGS...".
        for spec in "$@"; do
            label=${spec%%|*}
            read -r -a args <<<"${spec#*|}"
            rm -f "$tmp/job.csv"
            if ! fabric_run "$label" "$tool" "${args[@]}" -c "$tmp/job.csv" \
                -P "$FABRIC_PORT_COUNTERS" >"$tmp/job.out" 2>&1; then
                cat "$tmp/job.out" >&2
                rc=1
                continue
            fi
            grep -E "^mailrail_|elsewhere" "$tmp/job.out" | sed 's/^/  /'
            # The tool's header, once, behind the two columns this script adds.
            [ -s "$results" ] || head -n 1 "$tmp/job.csv" | sed 's/^/experiment,substrate,/' >"$results"
            awk -v p="$prefix" -v s="$substrate" 'NR > 1 { print p "," s "," $0 }' \
                "$tmp/job.csv" >>"$results"
        done
        return "$rc"
    }
    sweep_jobs "$@"
    return $?
fi

# --- The driver. ---
set -euo pipefail
usage() { sed -n '2,/^$/p' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$root/tools/workload_summary.sh"
out=build/workloads trials=3 contenders=alltoallv,none,rank,node,node+h ranks_list=''
skews="0 0.6 1.0 1.4" tokens=1024 hidden=7168 scales="12 14" features=128 substrate=tcp
build=build rate=200mbit buffer=32kb wait_ms=100 mpinet=--mpi-net exps=() pack=--pack datagram=
warmup=1
while [ $# -gt 0 ]; do
    case $1 in
        -o) out=$2; shift 2 ;;
        -t) trials=$2; shift 2 ;;
        -p) contenders=$2; shift 2 ;;
        --ranks) ranks_list=$2; shift 2 ;;
        --skews) skews=$2; shift 2 ;;
        --tokens) tokens=$2; shift 2 ;;
        --hidden) hidden=$2; shift 2 ;;
        --scales) scales=$2; shift 2 ;;
        --features) features=$2; shift 2 ;;
        --substrate) substrate=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --rate) rate=$2; shift 2 ;;
        --buffer) buffer=$2; shift 2 ;;
        --wait-ms) wait_ms=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --no-mpi-net) mpinet=''; shift ;;
        --no-pack) pack=''; shift ;;
        --datagram) datagram=$2; shift 2 ;;
        -h|--help) usage ;;
        -*) echo "workload_sweep: unknown option $1" >&2; usage ;;
        *) exps+=("$1"); shift ;;
    esac
done
[ ${#exps[@]} -gt 0 ] || usage
case $substrate in tcp|ucx) ;; *) echo "workload_sweep: --substrate tcp or ucx" >&2; exit 2 ;; esac
for n in $trials $tokens $hidden $features $wait_ms $warmup; do
    case $n in ''|*[!0-9]*) echo "workload_sweep: '$n' is not a number" >&2; exit 2 ;; esac
done
[ "$(id -u)" -eq 0 ] || { echo "workload_sweep: needs root (network namespaces)" >&2; exit 1; }
build=$(cd "$build" && pwd)
for t in moe/mailrail_moe graph/mailrail_gnn; do
    [ -x "$build/tools/$t" ] || { echo "workload_sweep: no $build/tools/$t; build first" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The fabric of P ranks: 4 sender hosts of (P - 4) / 4 ranks, a victim host of 4.
check_ranks() {
    case $1 in ''|*[!0-9]*) echo "workload_sweep: --ranks: '$1' is not a number" >&2; exit 2 ;; esac
    [ "$1" -ge 8 ] && [ $(($1 % 4)) -eq 0 ] && [ "$1" -le 1024 ] ||
        { echo "workload_sweep: --ranks: $1 is not a multiple of 4 from 8 to 1024" >&2; exit 2; }
}

# Runs the jobs "LABEL|ARGS" of TOOL on a fabric of P ranks; rows go to RESULTS.
layout() {
    local tool=$1 p=$2 results=$3 prefix=$4
    shift 4
    local per=$(((p - 4) / 4)) njobs=$#
    # Hundreds of ranks per core start and finish their collectives slowly.
    local job_timeout=$((600 + p * (trials + 1)))
    [ "$p" -ge 256 ] && export MAILRAIL_TIMEOUT=${MAILRAIL_TIMEOUT:-900}
    local dg=$datagram
    if [ -z "$dg" ]; then
        dg=4K
        [ "$p" -le 256 ] && dg=16K
        [ "$p" -le 128 ] && dg=32K
    fi
    export MAILRAIL_DATAGRAM_SIZE=$dg
    echo "== $prefix: $p ranks ($per on each of 4 sender hosts, 4 on the victim host), $substrate, port buffer $buffer, datagrams of $dg"
    # shellcheck disable=SC2086
    "$here/fabric.sh" -q -H 5 -R "$per" -V 1 --victim-ranks 4 --rate "$rate" --buffer "$buffer" \
        --substrate "$substrate" $mpinet --timeout "$job_timeout" \
        --total-timeout $(((job_timeout + 60) * njobs + 300)) --max-jobs "$njobs" \
        --script "$0" --jobs "$tool" "$substrate" "$tmp" "$results" "$prefix" "$@"
}

# The MoE jobs of one layout: one per skew, hot and (with SPREAD=1) spread.
moe_jobs() {
    local p=$1 spread=$2 list=$3 t e jobs=() s
    t=$((tokens / p)); [ "$t" -ge 1 ] || t=1
    e=256; [ "$p" -le 256 ] || e=$p
    [ $((e % p)) -eq 0 ] || e=$(((e / p + 1) * p))
    for s in $list; do
        jobs+=("moe-s$s-hot|-T $t -H $hidden -E $e -z $s --hot -t $trials --warmup $warmup -p $contenders -W $wait_ms $pack -q")
        [ "$spread" = 1 ] &&
            jobs+=("moe-s$s-spread|-T $t -H $hidden -E $e -z $s -t $trials --warmup $warmup -p $contenders -W $wait_ms $pack -q")
    done
    printf '%s\n' "${jobs[@]}"
}

moe_plots() {
    local exp=$1 x=$2 xlabel=$3
    summarize "$out/$exp.csv" "ranks skew hot" >"$out/${exp}_summary.csv"
    table "$out/${exp}_summary.csv"
    # One plot per placement: step time against the x column, per contender.
    local hot name
    for hot in 1 0; do
        name=$([ "$hot" = 1 ] && echo hot || echo spread)
        awk -F, -v h="$hot" 'NR == 1 || $3 == h' "$out/${exp}_summary.csv" >"$tmp/plot.csv"
        [ "$(wc -l <"$tmp/plot.csv")" -gt 1 ] || continue
        "$root/tools/plot/plot_lines.sh" -i "$tmp/plot.csv" -o "$out/${exp}_$name.png" -x "$x" \
            -y seconds_median -l seconds_min -u seconds_max -g contender \
            -t "MoE step on the emulated fabric ($substrate, $rate, $buffer port), experts $name: median of $trials, bars min-max" \
            -X "$xlabel" -Y "seconds per step"
        "$root/tools/plot/plot_lines.sh" -i "$tmp/plot.csv" -o "$out/${exp}_${name}_drops.png" -x "$x" \
            -y port_drops_median -g contender \
            -t "Packets the victim host's switch port dropped per MoE step, experts $name" \
            -X "$xlabel" -Y "packets dropped per step"
        "$root/tools/plot/plot_lines.sh" -i "$tmp/plot.csv" -o "$out/${exp}_${name}_hottest.png" -x "$x" \
            -y hottest_mib -g contender \
            -t "Bytes received by the hottest rank per MoE step, experts $name" \
            -X "$xlabel" -Y "MiB"
    done
}

expanded=()
for exp in "${exps[@]}"; do
    case $exp in
        moe|moe-ranks|gnn|quick) expanded+=("$exp") ;;
        *) echo "workload_sweep: unknown experiment $exp" >&2; usage ;;
    esac
done
for exp in "${expanded[@]}"; do
    case $exp in
        moe|quick)
            p=${ranks_list:-64}; p=${p%% *}
            list=$skews
            [ "$exp" = quick ] && list="0 1.0"
            check_ranks "$p"
            : >"$out/$exp.csv"
            mapfile -t jobs < <(moe_jobs "$p" 1 "$list")
            layout "$build/tools/moe/mailrail_moe" "$p" "$out/$exp.csv" "$exp" "${jobs[@]}"
            moe_plots "$exp" skew "Zipf skew s of the experts' popularity" ;;
        moe-ranks)
            : >"$out/$exp.csv"
            for p in ${ranks_list:-64 256 1024}; do
                check_ranks "$p"
                mapfile -t jobs < <(moe_jobs "$p" 0 1.0)
                layout "$build/tools/moe/mailrail_moe" "$p" "$out/$exp.csv" "$exp" "${jobs[@]}"
            done
            moe_plots "$exp" ranks "ranks (4 sender hosts, 4 ranks on the hot host)" ;;
        gnn)
            p=${ranks_list:-64}; p=${p%% *}
            check_ranks "$p"
            : >"$out/$exp.csv"
            jobs=()
            for sc in $scales; do
                jobs+=("gnn-r$sc|-r $sc -F $features -t $trials -p $contenders -W $wait_ms -q")
            done
            layout "$build/tools/graph/mailrail_gnn" "$p" "$out/$exp.csv" "$exp" "${jobs[@]}"
            summarize "$out/$exp.csv" "ranks vertices edges" >"$out/${exp}_summary.csv"
            table "$out/${exp}_summary.csv" ;;
    esac
    echo "CSV: $out/$exp.csv   summary: $out/${exp}_summary.csv"
done
