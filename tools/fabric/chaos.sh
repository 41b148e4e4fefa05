#!/usr/bin/env bash
# Faults on the emulated fabric (tools/fabric/fabric.sh): an incast of 4 sender
# hosts x R ranks onto one victim rank (tools/mailrail_chaos), with a fault
# injected in mid-run, per substrate and flow-control policy. Every case must
# end within its time limit with every message delivered exactly once, its
# bytes checked, or (ranks killed) a named peer failure on every survivor and
# the survivors' messages all delivered. Writes a CSV row per job and prints a
# table (docs/reliability.md has the results). Needs root, like fabric.sh.
#
#   tools/fabric/chaos.sh [options] [CASE...]
#
# Cases (default: all that this kernel can emulate):
#   clean      no fault: the reference
#   loss1      1% of packets dropped at random, each way, in every host
#              (iptables-legacy -m statistic -j DROP on INPUT)
#   loss5      5%
#   linkdown   the victim's switch port down for 2 s once traffic flows
#   duplicate  1% of the senders' packets to the victim sent twice (-j TEE)
#   reorder    2% of the senders' packets through a slow class (htb, 20 Mbit/s,
#              up to 100 packets queued: delayed by up to ~60 ms and overtaken
#              by the rest), chosen by iptables -m statistic -j CLASSIFY
#   kill       the ranks of sender host 0 killed with SIGKILL once traffic flows
#
# Not emulated here: delay and jitter on every packet, and reordering without
# delay, need netem, which this kernel lacks (the script says what it found).
#
# Options:
#   -o DIR          output directory (default build/chaos)
#   -R N            ranks per sender host (default 4: 16 senders)
#   -m MESSAGES     messages per sender (default 300, of 4 KiB)
#   -p POLICIES     comma-separated (default none,rank,node)
#   --substrates L  comma-separated, tcp and/or ucx (UCX's TCP transport) (default tcp,ucx)
#   --build DIR     the meson build directory (default build)
#   --limit S       each job's time limit in seconds (default 90): MAILRAIL_TIMEOUT
#                   and mailrail_chaos -T
set -uo pipefail

# --- Inside fabric.sh (sourced by --script with --jobs): one case's jobs. ---
chaos_wait_traffic() {
    # Until this job passed 1 MB through the victim's port (it is under way), at most 60 s.
    local b b0 _ i
    read -r b0 _ <<<"$(port_counters "${VICTIMS[0]}")"
    for ((i = 0; i < 600; i++)); do
        read -r b _ <<<"$(port_counters "${VICTIMS[0]}")"
        [ "${b:-0}" -ge $((${b0:-0} + 1000000)) ] && return 0
        sleep 0.1
    done
    return 1
}
chaos_fault_before() {
    local fault=$1 h ns victim_addr
    victim_addr=$(fabric_addr "${VICTIMS[0]}")
    case "$fault" in
    loss1 | loss5)
        local p=0.01
        [ "$fault" = loss5 ] && p=0.05
        for ((h = 0; h < FABRIC_HOSTS; h++)); do
            ip netns exec "$(host_ns "$h")" iptables-legacy -A INPUT -m statistic --mode random \
                --probability "$p" -j DROP || return 1
        done ;;
    duplicate)
        for ((h = 0; h < FABRIC_SENDER_HOSTS; h++)); do
            ip netns exec "$(host_ns "$h")" iptables-legacy -t mangle -A POSTROUTING \
                -d "$victim_addr" -m statistic --mode random --probability 0.01 \
                -j TEE --gateway "$victim_addr" || return 1
        done ;;
    reorder)
        for ((h = 0; h < FABRIC_SENDER_HOSTS; h++)); do
            ns=$(host_ns "$h")
            tc -n "$ns" qdisc replace dev eth0 root handle 1: htb default 10 r2q 1000 &&
                tc -n "$ns" class add dev eth0 parent 1: classid 1:10 htb rate "$RATE" burst 3kb &&
                tc -n "$ns" qdisc add dev eth0 parent 1:10 pfifo limit 10000 &&
                tc -n "$ns" class add dev eth0 parent 1: classid 1:20 htb rate 20mbit burst 3kb &&
                tc -n "$ns" qdisc add dev eth0 parent 1:20 pfifo limit 100 &&
                ip netns exec "$ns" iptables-legacy -t mangle -A POSTROUTING -o eth0 -p tcp \
                    -m statistic --mode random --probability 0.02 -j CLASSIFY --set-class 1:20 ||
                return 1
        done ;;
    esac
}
chaos_fault_during() {
    # In the background while the job runs: faults that strike in mid-run.
    local fault=$1 pid
    chaos_wait_traffic || return 0
    date +%s.%N >"$CHAOS_TMP/fault_epoch"
    case "$fault" in
    linkdown)
        ip -n "$NS_SW" link set "p${VICTIMS[0]}" down
        sleep 2
        ip -n "$NS_SW" link set "p${VICTIMS[0]}" up ;;
    kill)
        for pid in $(ip netns pids "$(host_ns 0)"); do
            [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = mailrail-chaos ] && kill -KILL "$pid"
        done ;;
    esac
}
chaos_jobs() {
    local fault=$1 substrate=$2 messages=$3 policies=$4 results=$5 build=$6 limit=$7
    local policy victim=$FABRIC_VICTIM_RANKS kill_list= rc line fault_epoch bgpid
    export CHAOS_TMP=$FABRIC_RUNDIR
    chaos_fault_before "$fault" || { echo "chaos: $fault could not be set up" >&2; return 1; }
    [ "$fault" = kill ] && kill_list="-k $(seq -s, 0 $((FABRIC_RANKS_PER_HOST - 1)))"
    for policy in ${policies//,/ }; do
        rm -f "$CHAOS_TMP/fault_epoch"
        chaos_fault_during "$fault" &
        bgpid=$!
        # shellcheck disable=SC2086
        # Hydra must let the others run on when the killed ranks' launchers exit.
        FABRIC_MPIEXEC_ARGS=-disable-auto-cleanup MAILRAIL_FLOWCTL=$policy MAILRAIL_TIMEOUT=$limit fabric_run "$fault-$substrate-$policy" \
            "$build/tools/mailrail_chaos" -v "$victim" -m "$messages" -T "$limit" $kill_list \
            >"$CHAOS_TMP/out" 2>"$CHAOS_TMP/err"
        rc=$?
        kill "$bgpid" 2>/dev/null
        wait "$bgpid" 2>/dev/null
        # The link must be up for the next job whatever happened.
        ip -n "$NS_SW" link set "p${VICTIMS[0]}" up 2>/dev/null
        cat "$CHAOS_TMP/out"
        grep -i "fail\|error" "$CHAOS_TMP/err" | sort | uniq -c | sort -rn | head -5
        # Every job's output is kept beside the CSV.
        cp "$CHAOS_TMP/out" "${results%.csv}-$fault-$substrate-$policy.out"
        cp "$CHAOS_TMP/err" "${results%.csv}-$fault-$substrate-$policy.err"
        fault_epoch=$(cat "$CHAOS_TMP/fault_epoch" 2>/dev/null || echo 0)
        # With ranks killed, hydra sometimes ends with "EXIT STRING: Hangup (signal 1)" and
        # status 1 although every process it started exited 0 (tests/run_peer_failure.sh):
        # then the survivors' own lines decide, as they do after status 0.
        if [ -n "$kill_list" ] && [ "$rc" -eq 1 ] &&
            grep -q "EXIT STRING: Hangup (signal 1)" "$CHAOS_TMP/out" "$CHAOS_TMP/err"; then
            rc=0
        fi
        # One row: totals over the ranks' lines, the victim's view, the verdict.
        awk -v fault="$fault" -v subst="$substrate" -v pol="$policy" -v rc="$rc" \
            -v victim="$victim" -v fe="$fault_epoch" -v n="$((FABRIC_RANKS_PER_HOST * 4 + 1))" \
            -v killed="$([ -n "$kill_list" ] && echo "$FABRIC_RANKS_PER_HOST" || echo 0)" '
            $1 == "chaos" && $2 == "rank" {
                r = $3; sub(":", "", r); lines++
                for (i = 4; i < NF; i += 2) v[$i] = $(i + 1)
                sent += v["sent"]; if (v["verdict"] != "ok") bad++
                if (r == victim) { rec = v["received"]; dup = v["duplicated"]; cor = v["corrupt"]
                                   lost = v["lost"]; fail = v["failures"]; ff = v["first_failure_epoch"]
                                   secs = v["seconds"] }
            }
            END {
                err = (ff > 0 && fe > 0) ? sprintf("%.2f", ff - fe) : ""
                ok = (rc == 0 && bad == 0 && lines == n - killed) ? "ok" : "FAIL"
                printf "%s,%s,%s,%d,%d,%d,%d,%d,%d,%d,%s,%s,%s\n", fault, subst, pol, n, sent, rec, dup,
                       cor, lost, fail, err, secs, ok
            }' "$CHAOS_TMP/out" >>"$results"
        tail -1 "$results"
    done
}
if [ "${1:-}" = --jobs ]; then
    shift
    chaos_jobs "$@"
    return $? 2>/dev/null || exit $?
fi

# --- Outside: one fabric per case and substrate. ---
here=$(cd "$(dirname "$0")" && pwd)
out=build/chaos ranks=4 messages=300 policies=none,rank,node substrates=tcp,ucx build=build
limit=90 cases=()
while [ $# -gt 0 ]; do
    case "$1" in
    -o) out=$2; shift 2 ;;
    -R) ranks=$2; shift 2 ;;
    -m) messages=$2; shift 2 ;;
    -p) policies=$2; shift 2 ;;
    --substrates) substrates=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --limit) limit=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "chaos.sh: unknown option $1" >&2; exit 2 ;;
    *) cases+=("$1"); shift ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "chaos.sh: needs root (network namespaces, tc, iptables)" >&2; exit 2; }
for t in ip tc iptables-legacy; do
    command -v "$t" >/dev/null || { echo "chaos.sh: '$t' is missing (Debian: iproute2 iptables)" >&2; exit 2; }
done
[ -x "$build/tools/mailrail_chaos" ] || { echo "chaos.sh: build $build first (ninja -C $build)" >&2; exit 2; }

# What this kernel can emulate: probed in a namespace of our own, removed at once.
probe_ns=mrchaos$$
trap 'ip netns del "$probe_ns" 2>/dev/null' EXIT INT TERM
can() { ip netns exec "$probe_ns" "$@" >/dev/null 2>&1; }
ip netns add "$probe_ns" && ip -n "$probe_ns" link add c0 type veth peer name c1 &&
    ip -n "$probe_ns" link set c0 up || { echo "chaos.sh: cannot create a namespace" >&2; exit 2; }
declare -A works
can iptables-legacy -A INPUT -m statistic --mode random --probability 0.01 -j DROP && works[loss]=1
can iptables-legacy -t mangle -A POSTROUTING -m statistic --mode random --probability 0.01 \
    -j TEE --gateway 10.213.255.2 && works[duplicate]=1
can tc qdisc add dev c0 root handle 1: htb default 10 &&
    can iptables-legacy -t mangle -A POSTROUTING -j CLASSIFY --set-class 1:20 && works[reorder]=1
can tc qdisc replace dev c0 root netem delay 10ms && works[netem]=1
ip netns del "$probe_ns"
trap - EXIT INT TERM
yn() { [ -n "${works[$1]:-}" ] && echo yes || echo no; }
echo "chaos.sh: this kernel: random loss $(yn loss), duplication (TEE) $(yn duplicate)," \
    "reordering through a slow class (htb + CLASSIFY) $(yn reorder), netem $(yn netem):" \
    "per-packet delay and jitter, and reordering without delay, $([ "$(yn netem)" = yes ] &&
        echo "could be emulated (not done)" || echo "cannot be emulated")"
if [ ${#cases[@]} -eq 0 ]; then
    cases=(clean)
    [ -n "${works[loss]:-}" ] && cases+=(loss1 loss5)
    cases+=(linkdown)
    [ -n "${works[duplicate]:-}" ] && cases+=(duplicate)
    [ -n "${works[reorder]:-}" ] && cases+=(reorder)
    cases+=(kill)
fi

mkdir -p "$out"
results=$out/chaos.csv
echo "case,substrate,policy,ranks,sent,delivered,duplicated,corrupt,lost,failures,time_to_error_s,victim_seconds,verdict" >"$results"
status=0
for c in "${cases[@]}"; do
    case "$c" in
    clean | linkdown | kill) ;;
    loss1 | loss5) [ -n "${works[loss]:-}" ] || { echo "chaos.sh: $c not emulated here"; continue; } ;;
    duplicate | reorder) [ -n "${works[$c]:-}" ] || { echo "chaos.sh: $c not emulated here"; continue; } ;;
    *) echo "chaos.sh: unknown case $c" >&2; exit 2 ;;
    esac
    for substrate in ${substrates//,/ }; do
        echo "== $c over $substrate: 4 sender hosts x $ranks ranks -> 1 victim, $messages x 4 KiB each"
        "$here/fabric.sh" -q -H 5 -R "$ranks" -V 1 --victim-ranks 1 --substrate "$substrate" \
            --timeout $((limit + 60)) --total-timeout $((4 * (limit + 90))) \
            --script "$0" --jobs "$c" "$substrate" "$messages" "$policies" "$(realpath "$results")" \
            "$(realpath "$build")" "$limit" || status=1
    done
done
echo
column -s, -t "$results"
grep -q ",FAIL$" "$results" && status=1
exit $status
