#!/usr/bin/env bash
# The MoE step (mailrail_moe) on one host, against MPI_Alltoallv: every rank
# count of --ranks, with ranks that spin when idle and with ranks that sleep
# (-w: mr_wait; MPI's nonblocking collectives tested with naps), with the
# default datagram and with each of --datagrams (tokens packed into datagrams,
# --pack). One MPI job per point runs every contender, interleaved trial by
# trial. Writes one CSV row per trial (moe_host.csv), a summary CSV (median,
# min, max, ratio to alltoallv's median) and prints it. docs/workloads.md has
# the results.
#
#   tools/workload_host.sh [options]
#
# Options:
#   -o DIR           output directory (default build/workloads-host)
#   -t TRIALS        trials per contender (default 5)
#   -p CONTENDERS    default alltoallv,none,rank,node,node+h
#   --ranks LIST     rank counts (default "2 4 8 16")
#   --modes LIST     spin and/or wait (default "spin wait")
#   --datagrams LIST default (MAILRAIL_DATAGRAM_SIZE's default, a datagram per token
#                    piece) and/or sizes for --pack, e.g. 64K (default "default 64K";
#                    each rank's receive pool is 1,024 slots of that size: 64 MiB)
#   --tokens N       tokens per rank (default 128); --hidden BYTES per token (7168)
#   --skew S         Zipf skew (default 0: uniform)
#   --warmup N       untimed steps before each timed one (default 3: MailRail's
#                    first steps after mr_init() are slower; with 16 ranks on 2
#                    cores it takes about 24 to reach steady state, see
#                    docs/workloads.md)
#   --substrate S    MAILRAIL_SUBSTRATE (default ucx)
#   --build DIR      the meson build directory (default build)
#   --limit S        each job's time limit in seconds (default 600)
set -euo pipefail
usage() { sed -n '2,${/^#/!q;p;}' "$0" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
. "$here/workload_summary.sh"
out=build/workloads-host trials=5 contenders=alltoallv,none,rank,node,node+h
ranks_list="2 4 8 16" modes="spin wait" datagrams="default 64K" tokens=128 hidden=7168
skew=0 warmup=3 substrate=ucx build=build limit=600
while [ $# -gt 0 ]; do
    case $1 in
        -o) out=$2; shift 2 ;;
        -t) trials=$2; shift 2 ;;
        -p) contenders=$2; shift 2 ;;
        --ranks) ranks_list=$2; shift 2 ;;
        --modes) modes=$2; shift 2 ;;
        --datagrams) datagrams=$2; shift 2 ;;
        --tokens) tokens=$2; shift 2 ;;
        --hidden) hidden=$2; shift 2 ;;
        --skew) skew=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --substrate) substrate=$2; shift 2 ;;
        --build) build=$2; shift 2 ;;
        --limit) limit=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "workload_host: unknown argument $1" >&2; usage ;;
    esac
done
for n in $trials $tokens $hidden $warmup $limit $ranks_list; do
    case $n in ''|*[!0-9]*) echo "workload_host: '$n' is not a number" >&2; exit 2 ;; esac
done
for m in $modes; do
    case $m in spin|wait) ;; *) echo "workload_host: --modes takes spin and wait" >&2; exit 2 ;; esac
done
moe=$build/tools/moe/mailrail_moe
[ -x "$moe" ] || { echo "workload_host: no $moe; build first" >&2; exit 1; }
command -v mpiexec >/dev/null || { echo "workload_host: no mpiexec (Debian: mpich)" >&2; exit 1; }
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
csv=$out/moe_host.csv
: >"$csv"
status=0
for p in $ranks_list; do
    experts=256
    [ $((experts % p)) -eq 0 ] || experts=$(((experts / p + 1) * p))
    for m in $modes; do
        for d in $datagrams; do
            args=(-T "$tokens" -H "$hidden" -E "$experts" -z "$skew" -t "$trials" --warmup "$warmup"
                  -p "$contenders" -q -c "$tmp/job.csv")
            [ "$m" = wait ] && args+=(-w)
            env=(MAILRAIL_SUBSTRATE="$substrate")
            if [ "$d" != default ]; then
                args+=(--pack)
                env+=(MAILRAIL_DATAGRAM_SIZE="$d")
            fi
            rm -f "$tmp/job.csv"
            echo "== $p ranks, $m, datagram $d" >&2
            if ! env "${env[@]}" timeout -k 10 "$limit" mpiexec -n "$p" "$moe" "${args[@]}" >&2; then
                echo "workload_host: the job of $p ranks, $m, datagram $d failed" >&2
                status=1
                continue
            fi
            # The tool's header, once, behind the four columns this script adds.
            [ -s "$csv" ] || head -n 1 "$tmp/job.csv" | sed 's/^/mode,datagram,warmup,substrate,/' >"$csv"
            awk -v x="$m,$d,$warmup,$substrate" 'NR > 1 { print x "," $0 }' "$tmp/job.csv" >>"$csv"
        done
    done
done
summarize "$csv" "ranks mode datagram" >"$out/moe_host_summary.csv"
table "$out/moe_host_summary.csv"
echo "workload_host: $csv, $out/moe_host_summary.csv" >&2
exit $status
