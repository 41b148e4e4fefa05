#!/usr/bin/env bash
# MailRail's own instructions per message, counted by callgrind: unlike a
# rate, a count does not depend on the neighbours (docs/performance.md).
#
# For each substrate, policy and size, runs `mailrail_perf -I` (2 ranks: rank
# 0 streams COUNT messages to rank 1) under valgrind --tool=callgrind, which
# dumps the stream and then IDLE polls with nothing to receive, each on its
# own. In every dump the instructions are summed by the object they ran in:
#   mailrail   libmailrail.so and the substrate plugin: MailRail's own work;
#   transport  everything else but the tool itself: UCX, MPI, libc, the kernel
#              interface: what the transport's calls cost underneath.
# An empty poll (a receive or poll that found nothing) costs what depends on
# timing, not on messages: the idle dump gives its price, and the tool counts
# how many the stream made. After each, the side naps 20 us outside MailRail
# (PERF_NAP_NS in the environment sets the nanoseconds, 0 none), so that the
# faster side makes a few per message, not dozens whose price, and the
# transport's work inside them, would swamp the count. So, per message and per side:
#   own    = (mailrail instructions of the stream - empty polls x idle price) / COUNT
#   polls  = empty polls / COUNT, and the idle price apart
#   transp = transport instructions of the stream / COUNT
#   coal   = the share of the sender's messages that travelled coalesced (several
#            in one transport message): it depends on timing, and a coalesced
#            message costs less on both sides, so read the counts beside it
# A policy with +h streams through active-message handlers (mailrail_perf -H),
# with +hc through handlers sent with mr_send_handler_copy() (-H -C).
# The policy `raw` (MPI only) is the transport alone: MPI driven asynchronously
# (mailrail_perf -a), all its instructions in the transport column, for the
# raw transport's cost per message beside MailRail's. (UCX's own cost is the
# transport column of MailRail's UCX rows: ucx_perftest has no such dumps.)
# Writes OUT/instructions.csv and prints a table; a run that fails makes the
# script name it and exit 1.
#
# Usage: tools/perf_instructions.sh [-b BUILD] [-s SIZES] [-n COUNT] [-S SUBSTRATES]
#                                   [-p POLICIES] [-o OUT]
#   defaults: -b build -s 8,512,4096 -n 20000 -S ucx,mpi,tcp
#             -p none,rank,node,none+h,raw -o BUILD/instructions
set -euo pipefail

build=build sizes=8,512,4096 count=20000 substrates=ucx,mpi,tcp policies=none,rank,node,none+h,raw
out=''
while getopts "b:s:n:S:p:o:h" opt; do
    case $opt in
        b) build=$OPTARG ;; s) sizes=$OPTARG ;; n) count=$OPTARG ;; S) substrates=$OPTARG ;;
        p) policies=$OPTARG ;; o) out=$OPTARG ;;
        *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2 ;;
    esac
done
out=${out:-$build/instructions}
perf="$build/tools/mailrail_perf"
[ -x "$perf" ] || { echo "perf_instructions: no $perf; build first" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "perf_instructions: valgrind is missing" >&2; exit 1; }
mkdir -p "$out"

# Sums one callgrind dump's self instructions by object: prints "mailrail transport".
# A cost line right after calls= is the call's inclusive cost, not self cost: skipped.
dump_costs() {
    awk '
        /^ob=/ { ob = substr($0, 4); next }
        /^calls=/ { skip = 1; next }
        /^[0-9+*-]/ {
            if (skip) { skip = 0; next }
            ir = $NF
            if (ob ~ /libmailrail\.so|mailrail_substrate_/) own += ir
            else if (ob !~ /mailrail_perf$/) other += ir
        }
        END { printf "%.0f %.0f\n", own, other }' "$1"
}

# The dump of rank R whose trigger is NAME ("stream 8", "idle 8").
dump_file() {
    grep -l "^desc: Trigger: Client Request: $2\$" "$1".* 2>/dev/null | head -1
}

failed=()
echo "substrate,policy,bytes,side,messages,own_ir_per_msg,empty_polls_per_msg,ir_per_empty_poll,transport_ir_per_msg,coalesced_share" \
    >"$out/instructions.csv"
for substrate in ${substrates//,/ }; do
    for policy in ${policies//,/ }; do
        flowctl=${policy%+h*} mode=() dgram=4096
        if [[ $policy == *+h ]]; then mode=(-H); fi
        if [[ $policy == *+hc ]]; then mode=(-H -C); fi
        if [[ $policy == raw ]]; then
            [[ $substrate == mpi ]] || continue
            flowctl=none mode=(-a)
        fi
        for size in ${sizes//,/ }; do
            [[ $policy == *+h* && $size -ge 4096 ]] && dgram=$((size + 1))
            [[ $policy != *+h* && $size -gt 4096 ]] && dgram=$size
            run="$out/$substrate-$policy-$size"
            rm -rf "$run" && mkdir -p "$run"
            if ! MAILRAIL_SUBSTRATE=$substrate MAILRAIL_FLOWCTL=$flowctl \
                MAILRAIL_DATAGRAM_SIZE=$dgram MAILRAIL_LOG_LEVEL=error \
                timeout -k 5 600 mpiexec -n 2 valgrind -q --tool=callgrind --compress-strings=no \
                --compress-pos=no --callgrind-out-file="$run/cg.%q{PMI_RANK}" \
                "$perf" -I "${mode[@]}" -s "$size" -n "$count" >"$run/out" 2>"$run/err"; then
                echo "perf_instructions: FAILED: $substrate $policy $size B (see $run/err)" >&2
                failed+=("$substrate $policy $size B")
                continue
            fi
            for side in 0 1; do
                line=$(grep "^instructions rank=$side size=$size " "$run/out" || true)
                stream=$(dump_file "$run/cg.$side" "stream $size")
                idle=$(dump_file "$run/cg.$side" "idle $size")
                if [ -z "$line" ] || [ -z "$stream" ] || [ -z "$idle" ]; then
                    echo "perf_instructions: FAILED: $substrate $policy $size B rank $side: no dump" >&2
                    failed+=("$substrate $policy $size B rank $side")
                    continue
                fi
                read -r s_own s_other <<<"$(dump_costs "$stream")"
                read -r i_own _ <<<"$(dump_costs "$idle")"
                empty=$(sed -n 's/.* empty_polls=\([0-9]*\).*/\1/p' <<<"$line")
                idle_polls=$(sed -n 's/.* idle_polls=\([0-9]*\).*/\1/p' <<<"$line")
                coalesced=$(sed -n 's/.* coalesced=\([0-9]*\).*/\1/p' <<<"$line")
                awk -v sb="$substrate" -v pol="$policy" -v z="$size" -v side="$side" -v n="$count" \
                    -v own="$s_own" -v other="$s_other" -v idle="$i_own" -v ip="$idle_polls" \
                    -v e="$empty" -v co="${coalesced:-0}" 'BEGIN {
                        price = ip > 0 ? idle / ip : 0 # raw MPI: no idle phase
                        printf "%s,%s,%s,%s,%d,%.1f,%.3f,%.1f,%.1f,%.3f\n", sb, pol, z,
                            side == 0 ? "sender" : "receiver", n, (own - e * price) / n, e / n,
                            price, other / n, co / n }' >>"$out/instructions.csv"
            done
        done
    done
done

# Sender plus receiver: the budget of docs/performance.md counts both.
awk -F, 'NR == 1 { next }
    { k = $1 "," $2 "," $3; if (!(k in own)) order[++n] = k
      own[k] += $6; polls[k] = polls[k] (polls[k] == "" ? "" : "/") sprintf("%.2f", $7)
      price[k] = price[k] (price[k] == "" ? "" : "/") sprintf("%.0f", $8); tr[k] += $9
      side[k, $4] = $6; if ($4 == "sender") coal[k] = $10 }
    END {
        printf "%-5s %-7s %6s %10s %10s %10s %12s %12s %10s %6s\n", "sub", "policy", "bytes",
            "own/msg", "sender", "receiver", "empty/msg", "Ir/empty", "transport", "coal"
        for (i = 1; i <= n; i++) {
            k = order[i]; split(k, f, ",")
            printf "%-5s %-7s %6s %10.0f %10.0f %10.0f %12s %12s %10.0f %5.0f%%\n", f[1], f[2], f[3],
                own[k], side[k, "sender"], side[k, "receiver"], polls[k], price[k], tr[k],
                100 * coal[k]
        }
    }' "$out/instructions.csv"
echo "CSV: $out/instructions.csv (per side; own = MailRail's instructions per message, empty polls apart)"
if [ ${#failed[@]} -gt 0 ]; then
    echo "perf_instructions: ${#failed[@]} runs failed:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
