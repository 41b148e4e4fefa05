#!/usr/bin/env bash
# fabric.sh: an emulated multi-host network on one machine, for showing TCP
# incast collapse through a shallow-buffered switch port and for running
# MailRail MPI jobs across the emulated hosts.
#
# Usage (as root):
#   tools/fabric/fabric.sh [options] -- PROG [ARGS...]
#       builds the fabric, runs `mpiexec -n H*R PROG ARGS` with the ranks spread
#       over the hosts, prints the victim ports' counters, tears everything down.
#       In ARGS the word @VICTIMS@ is replaced by the victim ranks (e.g.
#       `-- build/tools/mailrail_incast -V @VICTIMS@ -m 4000`).
#   tools/fabric/fabric.sh [options] --script FILE [SCRIPT-ARGS...]
#       builds the fabric once and sources the bash FILE (with SCRIPT-ARGS as $1...),
#       in which these functions run jobs and measurements in it:
#         fabric_run LABEL PROG [ARGS...]   one MPI job (mpiexec -n H*R, @VICTIMS@
#                                           replaced as above), bounded by --timeout;
#                                           prints the port counters of this job
#                                           (deltas) and appends them to --counters.
#                                           Returns the job's exit status. Variables
#                                           exported before it reach every rank, e.g.
#                                           `MAILRAIL_FLOWCTL=node fabric_run node ...`;
#                                           FABRIC_MPIEXEC_ARGS go to mpiexec (e.g.
#                                           -disable-auto-cleanup, for ranks killed on purpose)
#         fabric_substrate tcp|ucx          the substrate of the following jobs
#         fabric_exec HOST CMD [ARGS...]    CMD in host HOST's namespace (index 0..H-1),
#                                           with its hostname, bounded by --timeout
#         fabric_addr HOST                  prints host HOST's address
#         fabric_mark                       starts counting the ports' counters anew
#         fabric_report LABEL               prints (and appends to --counters) the
#                                           counters since fabric_mark or the last job
#       and these variables are exported: FABRIC_HOSTS, FABRIC_RANKS_PER_HOST,
#       FABRIC_VICTIM_HOSTS (host indices), FABRIC_VICTIM_RANKS (the first rank of each
#       victim host), FABRIC_RANKS (all ranks), FABRIC_SENDER_HOSTS, FABRIC_SENDER_RANKS,
#       FABRIC_VICTIM_RANKS_PER_HOST, FABRIC_NS_PREFIX, and FABRIC_PORT_COUNTERS: a
#       command that prints the victim ports' "sent_bytes sent_packets dropped
#       backlog_bytes" (summed), usable from inside a job (mailrail_incast -P).
#       The file runs in fabric.sh's own shell: `exit` ends the run (the fabric is
#       still torn down), and the exit status of the run is that of the file.
#   tools/fabric/fabric.sh --reap
#       removes what runs killed with SIGKILL left behind: namespaces mrf<PID>*,
#       CPU cgroups mrf<PID> and run directories /tmp/mrf<PID>.* whose PID is no
#       longer alive.
#
# Options:
#   -H N              emulated hosts (default 5; 2..32)
#   -R N              ranks per host (default 4; 1..256; at most 1,100 ranks in all, the
#                     paper's 1,024:1 incast on 4 sender hosts plus a victim)
#   -V N              victim hosts: the LAST N hosts (default 1; 0..H-1). Block placement:
#                     the sender hosts hold R ranks each (rank r on host r / R), then
#                     each victim host holds --victim-ranks ranks; FABRIC_VICTIM_RANKS
#                     lists the first rank of each victim host.
#   --victim-ranks N  ranks on each victim host (default R; 1 makes every other rank's
#                     traffic to the victim cross the victim's switch port)
#   --rate RATE       line rate of every link, tc syntax (default 200mbit)
#   --buffer SIZE     queue limit of the switch port toward each victim host, tc size
#                     syntax (default 32kb: a shallow-buffered switch port)
#   --deep            a deep victim port buffer instead: --buffer 4mb
#   --burst SIZE      token bucket depth of the switch ports' shapers (default 8kb,
#                     about 5 full frames)
#   --host-burst SIZE token bucket depth of the hosts' NIC shapers (default 3kb, 2
#                     full frames). Smaller than --burst on purpose: a software shaper
#                     whose timer fires late loses the tokens beyond its burst, and on
#                     a busy 2-core machine the switch port, if it lost more than the
#                     sending NIC, became the bottleneck of a single flow and dropped
#                     (measured: 4kb/4kb dropped ~100 packets per 4 s flow; 3kb/8kb
#                     dropped none at ~188 Mbit/s goodput; 2kb NICs fell to 145 Mbit/s).
#                     An idle port passes up to --burst bytes at once, so its
#                     effective buffer is about BUFFER + BURST.
#   --host-buffer SIZE  queue limit of the hosts' NICs and of the switch ports toward
#                     non-victim hosts (default 16mb, deep so that they do not drop:
#                     with 4mb, a 20-rank all-to-all dropped at the hosts' NICs, as
#                     each TCP socket may queue up to tcp_limit_output_bytes there)
#   --cc ALG          TCP congestion control inside the namespaces (default reno:
#                     loss-based, as in the incast literature). A namespace other than
#                     the root one may only pick one of the system's
#                     net.ipv4.tcp_allowed_congestion_control (Debian: reno bbr; cubic
#                     is not among them), which this script does not change
#   --substrate S     tcp: MAILRAIL_SUBSTRATE=tcp MAILRAIL_TCP_ADDR=eth0;
#                     ucx: MAILRAIL_SUBSTRATE=ucx MAILRAIL_UCX_TLS=tcp,self
#                     MAILRAIL_UCX_NET_DEVICES=eth0 MAILRAIL_UCX_ERROR_MODE=peer;
#                     none: leave the MAILRAIL_* environment as it is (default tcp)
#   --cpu host|shared  host (default): the ranks of each host run in a CPU cgroup of
#                     their own, all with the same weight, so that each host gets an
#                     equal share of the machine's cores when all are busy, as hosts
#                     with cores of their own would: a victim host with one rank is not
#                     starved by hundreds of sender ranks. shared: one pool of cores for
#                     all ranks, as before. Without a cgroup cpu controller (v1
#                     /sys/fs/cgroup/cpu or v2 with "cpu" in cgroup.controllers), host
#                     falls back to shared with a warning
#   --timeout SECONDS bound of each job (default 300): MPIEXEC_TIMEOUT, and `timeout`
#   --total-timeout SECONDS  bound of the whole run, fabric included (default: 120 +
#                     the job timeout with --, 3600 with --script)
#   --max-jobs N      most jobs of one --script run (default 100)
#   --counters FILE   append label,victim_host,sent_bytes,sent_packets,dropped,overlimits
#                     rows (a header first when FILE is new or empty)
#   --mpiexec PATH    the mpiexec to use (default: mpiexec on PATH, MPICH's hydra)
#   --mpi-net         MPICH's own traffic (MPI_Alltoallv, the collectives MailRail
#                     bootstraps with) crosses the fabric too: ranks of different hosts
#                     talk over UCX's tcp on eth0 (UCX_TLS=tcp,self UCX_NET_DEVICES=eth0,
#                     set for the jobs whatever the caller's UCX_TLS), ranks of one host
#                     over MPICH's shared memory, as on real hosts: hydra is given the
#                     hosts (-launcher fork -hosts mrf-h0:R,...), so that MPICH's node
#                     map (PMI_process_mapping) has H nodes. MPICH 4.0.2 hangs in
#                     MPI_Finalize over tcp (each rank closes its UCX endpoints, which
#                     waits for the peers' acknowledgements, then waits in a PMI barrier
#                     without answering the others'; upstream removed that barrier in
#                     pmodels/mpich PR 6596, 2023): the ranks preload a shim,
#                     tools/fabric/mpi_finalize_shim.c compiled into the run directory
#                     (needs cc and UCX's headers, Debian gcc libucx-dev), that keeps
#                     MPICH's UCX worker progressing from the first endpoint close
#                     until the worker is destroyed. Costs
#                     MPI_Finalize seconds at 40 ranks (all pairs close over tcp).
#                     Default: MPICH stays on shared memory (UCX_TLS=sm,self, one
#                     node), its traffic never reaches eth0
#   --subnet K        the test subnet 10.213.K.0/24 (default PID mod 256); it exists
#                     only inside the namespaces
#   -q                quieter: no progress messages
#
# The fabric. Namespaces mrf<PID>sw (the switch: bridge br0 with one port p<h> per
# host) and mrf<PID>h0 .. mrf<PID>h<H-1> (the hosts: eth0 = 10.213.K.(h+1)/24, the
# peer of p<h>). Both veth ends are created inside the namespaces; nothing is
# added to the root namespace, no default route exists. MTU 1500; tso, gso, gro
# (and lro, ufo where present) off on every veth end; IPv6 off. Every link runs
# at RATE both ways (tbf on eth0 of each host and on each switch port); the
# switch port toward a victim host holds at most BUFFER bytes, and drops beyond.
# Each rank runs in its host's network namespace and in a UTS namespace of its
# own named mrf-h<h>, so MailRail sees H nodes (MAILRAIL_FLOWCTL=node needs no
# MAILRAIL_RANKS_PER_NODE). mpiexec itself (hydra, fork launcher) stays in the
# root namespace: PMI goes over an inherited descriptor and MPICH's own traffic
# over /dev/shm, which all namespaces share; MPICH's UCX gets UCX_TLS=sm,self
# (MailRail's UCX reads MAILRAIL_UCX_TLS first, so it keeps tcp on eth0). UCX's
# sm transports would reach across the hosts too (same boot id, same IPC
# namespace), so --mpi-net leaves them out of UCX_TLS.
#
# Teardown on exit, failure, SIGINT and SIGTERM: the running job is stopped, the
# processes left in the namespaces are killed, the namespaces deleted (which
# deletes their interfaces), the CPU cgroups removed, and the /dev/shm/mailrail-*
# segments created by this run's ranks removed. Namespace names carry the PID, so concurrent runs do not
# collide and each removes only its own.
#
# Needs root and: ip, tc (Debian iproute2), ethtool (ethtool), unshare (util-linux),
# timeout (coreutils), mpiexec (mpich).
set -o pipefail

FABRIC_SELF=$(readlink -f "${BASH_SOURCE[0]}")

# ---------------------------------------------------------------------------
# Rank wrapper: mpiexec runs `fabric.sh --rank-wrapper PROG ARGS` for every
# rank; it moves into its host's namespaces and execs PROG there (same PID).
# ---------------------------------------------------------------------------
if [ "${1:-}" = "--rank-wrapper" ]; then
    shift
    rank=${PMI_RANK:-${PMIX_RANK:-}}
    case "$rank" in ''|*[!0-9]*) echo "fabric.sh: --rank-wrapper: no PMI_RANK from mpiexec" >&2; exit 2 ;; esac
    case "${FABRIC_NS_PREFIX:-}" in mrf[0-9]*) ;; *) echo "fabric.sh: --rank-wrapper: runs only under fabric.sh" >&2; exit 2 ;; esac
    # Sender hosts first, R ranks each; then the victim hosts, RV ranks each.
    if [ "$rank" -lt "$FABRIC_SENDER_RANKS" ]; then
        host=$((rank / FABRIC_RANKS_PER_HOST))
    else
        host=$((FABRIC_SENDER_HOSTS + (rank - FABRIC_SENDER_RANKS) / FABRIC_VICTIM_RANKS_PER_HOST))
    fi
    if [ "$host" -ge "$FABRIC_HOSTS" ]; then
        echo "fabric.sh: rank $rank has no host (H=$FABRIC_HOSTS R=$FABRIC_RANKS_PER_HOST)" >&2
        exit 2
    fi
    # The PID survives the execs below: it identifies this run's shm segments.
    echo "$$" >>"$FABRIC_RUNDIR/pids"
    # The host's CPU share (--cpu host): its own cgroup, as if it had cores of its own.
    if [ -n "${FABRIC_CGROUP:-}" ]; then
        echo "$$" >"$FABRIC_CGROUP/h$host/cgroup.procs" ||
            { echo "fabric.sh: rank $rank cannot join the cgroup of host $host" >&2; exit 2; }
    fi
    # --mpi-net: the finalize shim goes into the program (not into ip, unshare, sh),
    # after the caller's preloads; a program linked with ASan would otherwise refuse
    # a preload that its runtime does not precede.
    exec ip netns exec "${FABRIC_NS_PREFIX}h$host" unshare --uts \
        sh -c 'echo "$0" >/proc/sys/kernel/hostname || exit
               if [ -n "${FABRIC_MPI_PRELOAD:-}" ]; then
                   export LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$FABRIC_MPI_PRELOAD"
                   export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
               fi
               exec "$@"' "mrf-h$host" "$@"
fi

# ---------------------------------------------------------------------------
# Port counters from inside a job: `fabric.sh --port-counters` (the command in
# $FABRIC_PORT_COUNTERS) prints "sent_bytes sent_packets dropped backlog_bytes",
# summed over the victim hosts' switch ports, so that a tool that runs several
# trials in one job can count each trial's drops. Runs in any of the run's
# namespaces (tc -n enters the switch's), as root, like the ranks.
# ---------------------------------------------------------------------------
if [ "${1:-}" = "--port-counters" ]; then
    case "${FABRIC_NS_PREFIX:-}" in mrf[0-9]*) ;; *) echo "fabric.sh: --port-counters: runs only under fabric.sh" >&2; exit 2 ;; esac
    for v in ${FABRIC_VICTIM_HOSTS//,/ }; do
        tc -n "${FABRIC_NS_PREFIX}sw" -s qdisc show dev "p$v" 2>/dev/null
    done | awk '
        $1 == "Sent" { b += $2; p += $4; d0 = $7; sub(",", "", d0); d += d0 }
        $1 == "backlog" { q0 = $2; sub("b", "", q0); if (q0 ~ /K$/) { sub("K", "", q0); q0 *= 1024 }
                          else if (q0 ~ /M$/) { sub("M", "", q0); q0 *= 1048576 }; q += q0 }
        END { printf "%.0f %.0f %.0f %.0f\n", b, p, d, q }'
    exit 0
fi

# ---------------------------------------------------------------------------
# Options.
# ---------------------------------------------------------------------------
H=5 R=4 V=1 RV=''
RATE=200mbit BUFFER=32kb BURST=8kb HOST_BURST=3kb HOSTBUF=16mb CC=reno
SUBSTRATE=tcp JOB_TIMEOUT=300 TOTAL_TIMEOUT='' MAX_JOBS=100 COUNTERS='' MPIEXEC=mpiexec
SUBNET=$(($$ % 256)) QUIET=0 MODE='' SCRIPT='' REAP=0 CPU=host MPI_NET=0

die() { echo "fabric.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -o pipefail/p' "$FABRIC_SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
need_arg() { [ $# -ge 2 ] || die "option $1 needs a value"; }
is_uint() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }

while [ $# -gt 0 ]; do
    case "$1" in
        -H) need_arg "$@"; H=$2; shift 2 ;;
        -R) need_arg "$@"; R=$2; shift 2 ;;
        -V) need_arg "$@"; V=$2; shift 2 ;;
        --victim-ranks) need_arg "$@"; RV=$2; shift 2 ;;
        --rate) need_arg "$@"; RATE=$2; shift 2 ;;
        --buffer) need_arg "$@"; BUFFER=$2; shift 2 ;;
        --deep) BUFFER=4mb; shift ;;
        --burst) need_arg "$@"; BURST=$2; shift 2 ;;
        --host-buffer) need_arg "$@"; HOSTBUF=$2; shift 2 ;;
        --host-burst) need_arg "$@"; HOST_BURST=$2; shift 2 ;;
        --cc) need_arg "$@"; CC=$2; shift 2 ;;
        --substrate) need_arg "$@"; SUBSTRATE=$2; shift 2 ;;
        --cpu) need_arg "$@"; CPU=$2; shift 2 ;;
        --timeout) need_arg "$@"; JOB_TIMEOUT=$2; shift 2 ;;
        --total-timeout) need_arg "$@"; TOTAL_TIMEOUT=$2; shift 2 ;;
        --max-jobs) need_arg "$@"; MAX_JOBS=$2; shift 2 ;;
        --counters) need_arg "$@"; COUNTERS=$2; shift 2 ;;
        --mpiexec) need_arg "$@"; MPIEXEC=$2; shift 2 ;;
        --mpi-net) MPI_NET=1; shift ;;
        --subnet) need_arg "$@"; SUBNET=$2; shift 2 ;;
        -q) QUIET=1; shift ;;
        --reap) REAP=1; shift ;;
        --script) need_arg "$@"; MODE=script; SCRIPT=$2; shift 2; break ;;
        --) MODE=run; shift; break ;;
        -h|--help) usage ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
# What is left in "$@": PROG ARGS (--) or the script's arguments (--script).

# Refusals: one line, non-zero exit, before anything is created.
[ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, tc)"
for tool in ip tc ethtool unshare timeout; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "'$tool' is missing (Debian packages: iproute2 ethtool util-linux coreutils)"
done

# The cgroup directory with a cpu controller (v1, or v2 with cpu enabled below
# the root), or nothing.
cgroup_root() {
    if [ -e /sys/fs/cgroup/cpu/cpu.shares ]; then
        echo /sys/fs/cgroup/cpu
    elif grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        echo /sys/fs/cgroup
    fi
}
# Removes a run's cgroup tree (its processes are gone or moved out).
cgroup_remove() {
    local d=$1 sub p
    for sub in "$d"/h*; do
        [ -d "$sub" ] || continue
        for p in $(cat "$sub/cgroup.procs" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
        for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$sub" 2>/dev/null && break; sleep 0.2; done
    done
    rmdir "$d" 2>/dev/null
}

if [ "$REAP" -eq 1 ]; then
    # Only namespaces and run directories of fabric.sh runs whose process is gone.
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^mrf[0-9]+(sw|h[0-9]+)$'); do
        pid=${ns#mrf}; pid=${pid%%[!0-9]*}
        if ! kill -0 "$pid" 2>/dev/null; then
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
            ip netns del "$ns" && echo "removed namespace $ns"
        fi
    done
    for d in "$(cgroup_root)"/mrf[0-9]*; do
        [ -d "$d" ] || continue
        pid=${d##*/mrf}
        kill -0 "$pid" 2>/dev/null || { cgroup_remove "$d"; echo "removed cgroup $d"; }
    done
    for d in /tmp/mrf[0-9]*.*; do
        [ -d "$d" ] || continue
        pid=${d#/tmp/mrf}; pid=${pid%%.*}
        kill -0 "$pid" 2>/dev/null || { rm -rf -- "$d"; echo "removed $d"; }
    done
    exit 0
fi

[ -n "$MODE" ] || die "nothing to run: give -- PROG [ARGS] or --script FILE (see --help)"
for v in H R V JOB_TIMEOUT MAX_JOBS SUBNET; do is_uint "${!v}" || die "$v must be a non-negative integer"; done
[ "$H" -ge 2 ] && [ "$H" -le 32 ] || die "-H must be 2..32"
[ "$R" -ge 1 ] && [ "$R" -le 256 ] || die "-R must be 1..256"
RV=${RV:-$R}
is_uint "$RV" && [ "$RV" -ge 1 ] && [ "$RV" -le 256 ] || die "--victim-ranks must be 1..256"
NRANKS=$(((H - V) * R + V * RV))
[ "$NRANKS" -le 1100 ] || die "at most 1,100 ranks in all (here $NRANKS)"
[ "$V" -lt "$H" ] || die "-V must be less than -H (at least one sender host)"
[ "$SUBNET" -le 255 ] || die "--subnet must be 0..255"
[ "$JOB_TIMEOUT" -ge 1 ] || die "--timeout must be at least 1"
case "$SUBSTRATE" in tcp|ucx|none) ;; *) die "--substrate must be tcp, ucx or none" ;; esac
case "$CPU" in host|shared) ;; *) die "--cpu must be host or shared" ;; esac
if [ "$MODE" = run ]; then
    [ $# -ge 1 ] || die "no program after --"
    : "${TOTAL_TIMEOUT:=$((JOB_TIMEOUT + 120))}"
else
    [ -f "$SCRIPT" ] && [ -r "$SCRIPT" ] || die "cannot read script '$SCRIPT'"
    : "${TOTAL_TIMEOUT:=3600}"
fi
is_uint "$TOTAL_TIMEOUT" && [ "$TOTAL_TIMEOUT" -ge 1 ] || die "--total-timeout must be a positive integer"
if [ "$MPIEXEC" = mpiexec ]; then
    MPIEXEC=$(command -v mpiexec) || die "'mpiexec' is missing (Debian package mpich)"
fi
[ -x "$MPIEXEC" ] || die "mpiexec '$MPIEXEC' is not executable"
if [ "$MPI_NET" -eq 1 ] && ! echo '#include <ucp/api/ucp.h>' | cc -E -x c - >/dev/null 2>&1; then
    die "--mpi-net needs cc and UCX's headers for its MPI_Finalize shim (Debian packages: gcc libucx-dev)"
fi
grep -qw -- "$CC" /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null ||
    die "congestion control '$CC' cannot be set in a namespace: allowed are $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null)"

# ---------------------------------------------------------------------------
# Names, teardown.
# ---------------------------------------------------------------------------
P="mrf$$"
NS_SW="${P}sw"
NETS="10.213.$SUBNET"
host_ns() { echo "${P}h$1"; }
CREATED=()          # namespaces created by this run, for the teardown
CGROUP=             # the run's cgroup (--cpu host), for the teardown
RUNDIR=
JOBPID=             # the `timeout` of the running job
WATCHDOG=
CLEANED=0
VICTIMS=()          # host indices
for ((h = H - V; h < H; h++)); do VICTIMS+=("$h"); done

ns_exists() {
    local list
    list=$(ip netns list 2>/dev/null | awk '{print $1}')
    grep -qx -- "$1" <<<"$list"
}
say() { [ "$QUIET" -eq 1 ] || echo "fabric: $*" >&2; }

stop_job() {
    [ -n "$JOBPID" ] || return 0
    if kill -0 "$JOBPID" 2>/dev/null; then
        kill -TERM "$JOBPID" 2>/dev/null
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$JOBPID" 2>/dev/null || break; sleep 0.5; done
        kill -KILL "$JOBPID" 2>/dev/null
    fi
    wait "$JOBPID" 2>/dev/null
    JOBPID=
}

# Removes the /dev/shm/mailrail-* segments whose creator (offset 20 of the
# segment, see flowctl/node/mr_node_segment.h) was one of this run's ranks.
remove_own_segments() {
    [ -n "$RUNDIR" ] && [ -s "$RUNDIR/pids" ] || return 0
    local seg pid
    for seg in /dev/shm/mailrail-*; do
        [ -f "$seg" ] || continue
        pid=$(od -An -t d4 -j 20 -N 4 "$seg" 2>/dev/null | tr -d ' ')
        [ -n "$pid" ] && grep -qx "$pid" "$RUNDIR/pids" && rm -f -- "$seg"
    done
}

teardown() {
    [ "$CLEANED" -eq 0 ] || return 0
    CLEANED=1
    trap '' INT TERM
    stop_job
    local ns p left=()
    # Whatever still runs inside the namespaces was started by this run.
    for ns in "${CREATED[@]}"; do
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -TERM "$p" 2>/dev/null; done
    done
    for ns in "${CREATED[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break; sleep 0.2; done
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    done
    for ns in "${CREATED[@]}"; do ip netns del "$ns" 2>/dev/null; done
    [ -n "$CGROUP" ] && cgroup_remove "$CGROUP"
    remove_own_segments
    if [ -n "$WATCHDOG" ]; then kill "$WATCHDOG" 2>/dev/null; wait "$WATCHDOG" 2>/dev/null; fi
    [ -n "$RUNDIR" ] && rm -rf -- "$RUNDIR"
    for ns in "${CREATED[@]}"; do
        ns_exists "$ns" && left+=("$ns")
    done
    if [ ${#left[@]} -gt 0 ]; then
        echo "fabric.sh: could not remove namespace(s) ${left[*]}" >&2
    elif [ ${#CREATED[@]} -gt 0 ]; then
        say "torn down (${#CREATED[@]} namespaces removed)"
    fi
}
on_signal() {
    echo "fabric.sh: $1 received, tearing down" >&2
    teardown
    [ "$1" = INT ] && exit 130
    exit 143
}
trap teardown EXIT
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM

# The whole run's bound: the watchdog sends SIGTERM, whose trap tears down. It
# ends with the run, also with a run killed by SIGKILL (then --reap cleans up).
( trap 'kill "$sp" 2>/dev/null; exit 0' TERM
  end=$((SECONDS + TOTAL_TIMEOUT))
  while [ "$SECONDS" -lt "$end" ]; do
      kill -0 $$ 2>/dev/null || exit 0
      sleep 1 & sp=$!
      wait "$sp" || exit 0
  done
  echo "fabric.sh: --total-timeout of $TOTAL_TIMEOUT s reached" >&2 && kill -TERM $$
) </dev/null &
WATCHDOG=$!

# ---------------------------------------------------------------------------
# Building the fabric.
# ---------------------------------------------------------------------------
run() { "$@" || die "failed: $*"; }
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

for ns in "$NS_SW" $(for ((h = 0; h < H; h++)); do host_ns "$h"; done); do
    ns_exists "$ns" &&
        die "namespace $ns already exists (a killed run with this PID? see --reap)"
done
RUNDIR=$(mktemp -d "/tmp/${P}.XXXXXX") || die "cannot create a run directory in /tmp"
: >"$RUNDIR/pids"

# One CPU cgroup per host, equal weights (--cpu host).
if [ "$CPU" = host ]; then
    cgr=$(cgroup_root)
    if [ -z "$cgr" ]; then
        echo "fabric.sh: no cgroup cpu controller: every rank shares the cores (--cpu shared)" >&2
    else
        if [ "$cgr" = /sys/fs/cgroup ]; then
            echo +cpu >"$cgr/cgroup.subtree_control" 2>/dev/null
        fi
        run mkdir "$cgr/$P"
        CGROUP=$cgr/$P
        [ "$cgr" = /sys/fs/cgroup ] && run sh -c "echo +cpu >'$CGROUP/cgroup.subtree_control'"
        for ((h = 0; h < H; h++)); do run mkdir "$CGROUP/h$h"; done
    fi
fi

# Per namespace: no IPv6 (no router solicitations or DAD on the ports), the
# congestion control, loopback up.
ns_init() {
    local ns=$1
    run ip netns add "$ns"
    CREATED+=("$ns")
    run nsx "$ns" sh -c "echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6 &&
        echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6 &&
        echo $CC >/proc/sys/net/ipv4/tcp_congestion_control"
    run ip -n "$ns" link set lo up
}

# Offloads off so that a queue holds real (at most MTU-sized) packets.
offloads_off() {
    local ns=$1 dev=$2 f k
    for f in tso gso gro; do run nsx "$ns" ethtool -K "$dev" "$f" off; done
    for f in lro ufo; do nsx "$ns" ethtool -K "$dev" "$f" off >/dev/null 2>&1; done
    k=$(nsx "$ns" ethtool -k "$dev" |
        grep -E '^(tcp-segmentation-offload|generic-segmentation-offload|generic-receive-offload|large-receive-offload|udp-fragmentation-offload): on')
    [ -z "$k" ] || die "offloads still on for $dev in $ns: $k"
}

shape() {
    local ns=$1 dev=$2 burst=$3 limit=$4
    run tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$RATE" burst "$burst" limit "$limit"
}

is_victim() { local v; for v in "${VICTIMS[@]}"; do [ "$v" = "$1" ] && return 0; done; return 1; }

say "building $H hosts x $R ranks (victim hosts: ${VICTIMS[*]:-none}), $RATE, victim port buffer $BUFFER burst $BURST, host NIC burst $HOST_BURST, $CC, subnet $NETS.0/24, namespaces ${P}*"
ns_init "$NS_SW"
run ip -n "$NS_SW" link add br0 type bridge stp_state 0
run ip -n "$NS_SW" link set br0 up
for ((h = 0; h < H; h++)); do
    hn=$(host_ns "$h")
    ns_init "$hn"
    # Both ends are created inside the namespaces: none ever is in the root one.
    run ip -n "$NS_SW" link add "p$h" mtu 1500 type veth peer name eth0 mtu 1500 netns "$hn"
    run ip -n "$hn" addr add "$NETS.$((h + 1))/24" dev eth0
    offloads_off "$hn" eth0
    offloads_off "$NS_SW" "p$h"
    shape "$hn" eth0 "$HOST_BURST" "$HOSTBUF"
    if is_victim "$h"; then
        shape "$NS_SW" "p$h" "$BURST" "$BUFFER"
    else
        shape "$NS_SW" "p$h" "$BURST" "$HOSTBUF"
    fi
    run ip -n "$NS_SW" link set "p$h" master br0
    run ip -n "$NS_SW" link set "p$h" up
    run ip -n "$hn" link set eth0 up
done
# Every host reaches every other one before a job: a TCP connection to a port
# where nothing listens is refused (a reset came back) only if the path works.
reachable() {
    local out
    out=$(nsx "$(host_ns "$1")" timeout 3 bash -c "exec 3<>/dev/tcp/$2/9" 2>&1)
    case "$out" in *refused*) return 0 ;; esac
    return 1
}
for ((h = 1; h < H; h++)); do
    reachable 0 "$NETS.$((h + 1))" || reachable 0 "$NETS.$((h + 1))" ||
        die "host h0 cannot reach host h$h ($NETS.$((h + 1))) through the switch"
done

# ---------------------------------------------------------------------------
# The job environment and running jobs.
# ---------------------------------------------------------------------------
victim_ranks=
for v in "${VICTIMS[@]}"; do victim_ranks+="${victim_ranks:+,}$(((H - V) * R + (v - H + V) * RV))"; done
export FABRIC_HOSTS=$H FABRIC_RANKS_PER_HOST=$R FABRIC_RANKS=$NRANKS
export FABRIC_SENDER_HOSTS=$((H - V)) FABRIC_SENDER_RANKS=$(((H - V) * R)) FABRIC_VICTIM_RANKS_PER_HOST=$RV
export FABRIC_VICTIM_HOSTS="${VICTIMS[*]}" FABRIC_VICTIM_RANKS=$victim_ranks
export FABRIC_VICTIM_HOSTS=${FABRIC_VICTIM_HOSTS// /,}
export FABRIC_NS_PREFIX=$P FABRIC_RUNDIR=$RUNDIR FABRIC_CGROUP=$CGROUP
export FABRIC_PORT_COUNTERS="$FABRIC_SELF --port-counters"
# mpiexec holds a few descriptors per rank: hundreds of ranks need more than 1024.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# --mpi-net: the shim the ranks preload (LD_PRELOAD, over FABRIC_MPI_PRELOAD), built
# from mpi_finalize_shim.c beside this script into the run directory. MPICH
# 4.0.2's MPI_Finalize calls ucp_disconnect_nb for every endpoint, progresses until
# all are closed, then waits in a PMI barrier. Over UCX's tcp a close in FLUSH mode
# sends the peer a zero-length PUT and waits for its PUT ACK; a peer that finished
# its own closes sits in the PMI barrier and never answers, so the last ranks to
# reach MPI_Finalize hang there (seen from 3 ranks on: 4 of 4 jobs of 6 or 20 ranks
# on loopback, without any namespace). From the first ucp_disconnect_nb until
# ucp_worker_destroy, a thread progresses the workers MPICH progresses (so that the
# rank keeps answering while in the barrier), and the UCP calls MPICH makes there
# are serialized with it (its workers are UCS_THREAD_MODE_SERIALIZED); a progress
# call that found nothing to do sleeps 100 us, so that dozens of ranks spinning in
# MPI_Finalize leave the cores to the peers they wait for (40 ranks: MPI_Finalize
# took 2-28 s, median 2.3, against 4-14 s, median 5.0, spinning). Before the
# first close every call goes straight through.

# MPICH's own UCX stays on shared memory; MailRail's UCX reads MAILRAIL_UCX_TLS first.
# With --mpi-net, hydra gets the hosts (MPICH's node map then has H nodes: shared
# memory within a host) and MPICH's UCX only tcp on eth0 (its sm would reach across
# the hosts: one boot id, one IPC namespace), and the ranks preload the finalize shim.
MPI_NET_ARGS=()
if [ "$MPI_NET" -eq 1 ]; then
    hosts=
    for ((h = 0; h < H; h++)); do
        n=$R
        is_victim "$h" && n=$RV
        hosts+="${hosts:+,}mrf-h$h:$n"
    done
    MPI_NET_ARGS=(-launcher fork -hosts "$hosts")
    if ! cc -shared -fPIC -O2 -o "$RUNDIR/mpi_finalize_shim.so" \
        "$(dirname "$FABRIC_SELF")/mpi_finalize_shim.c" \
        -ldl -lpthread 2>"$RUNDIR/mpi_finalize_shim.log"; then
        die "--mpi-net: cannot compile the MPI_Finalize shim: $(head -c 400 "$RUNDIR/mpi_finalize_shim.log")"
    fi
    export UCX_TLS=tcp,self UCX_NET_DEVICES=eth0 FABRIC_MPI_PRELOAD=$RUNDIR/mpi_finalize_shim.so
else
    export UCX_TLS=${UCX_TLS:-sm,self}
fi

fabric_substrate() {
    case "$1" in
        tcp) export MAILRAIL_SUBSTRATE=tcp MAILRAIL_TCP_ADDR=eth0 ;;
        ucx) export MAILRAIL_SUBSTRATE=ucx MAILRAIL_UCX_TLS=tcp,self MAILRAIL_UCX_NET_DEVICES=eth0
             export MAILRAIL_UCX_ERROR_MODE=${MAILRAIL_UCX_ERROR_MODE:-peer} ;;
        none) ;;
        *) echo "fabric_substrate: tcp, ucx or none" >&2; return 2 ;;
    esac
}
fabric_substrate "$SUBSTRATE"

fabric_addr() { echo "$NETS.$(($1 + 1))"; }

# Counters of the victim ports: "sent_bytes sent_packets dropped overlimits backlog".
port_counters() {
    tc -n "$NS_SW" -s qdisc show dev "p$1" 2>/dev/null | awk '
        $1 == "Sent" { b = $2; p = $4; d = $7; o = $9; sub(",", "", d) }
        $1 == "backlog" { q = $2 }
        END { printf "%.0f %.0f %.0f %.0f %s\n", b, p, d, o, (q == "" ? "0b" : q) }'
}
# Drops of a device's root qdisc (listed first; a classful root, such as chaos.sh's
# htb, counts its classes' drops too).
qdisc_drops() {
    tc -n "$1" -s qdisc show dev "$2" 2>/dev/null |
        awk '$1 == "Sent" && !n++ { d = $7; sub(",", "", d); print d + 0 }'
}
# Drops elsewhere than at the victim ports: "host-NICs other-switch-ports".
other_drops() {
    local h nic=0 port=0 d
    for ((h = 0; h < H; h++)); do
        d=$(qdisc_drops "$(host_ns "$h")" eth0)
        nic=$((nic + ${d:-0}))
        is_victim "$h" && continue
        d=$(qdisc_drops "$NS_SW" "p$h")
        port=$((port + ${d:-0}))
    done
    echo "$nic $port"
}
declare -A MARK
fabric_mark() {
    local v
    for v in "${VICTIMS[@]}"; do MARK[$v]=$(port_counters "$v"); done
    MARK[other]=$(other_drops)
}
fabric_report() {
    local label=${1//,/_} v b0 p0 d0 o0 b1 p1 d1 o1 q1 _
    for v in "${VICTIMS[@]}"; do
        read -r b0 p0 d0 o0 _ <<<"${MARK[$v]:-0 0 0 0 0b}"
        read -r b1 p1 d1 o1 q1 <<<"$(port_counters "$v")"
        printf '%s: port h%s: sent %d B %d pkt, dropped %d, overlimits %d, backlog %s\n' \
            "$label" "$v" $((b1 - b0)) $((p1 - p0)) $((d1 - d0)) $((o1 - o0)) "$q1"
        if [ -n "$COUNTERS" ]; then
            [ -s "$COUNTERS" ] ||
                echo "label,victim_host,sent_bytes,sent_packets,dropped,overlimits" >>"$COUNTERS"
            echo "$label,h$v,$((b1 - b0)),$((p1 - p0)),$((d1 - d0)),$((o1 - o0))" >>"$COUNTERS"
        fi
    done
    read -r d0 o0 <<<"${MARK[other]:-0 0}"
    read -r d1 o1 <<<"$(other_drops)"
    printf '%s: elsewhere: host NICs dropped %d, non-victim switch ports dropped %d\n' \
        "$label" $((d1 - d0)) $((o1 - o0))
    fabric_mark
}

JOBS=0
fabric_run() {
    local label=$1 rc a args=()
    shift
    [ $# -ge 1 ] || { echo "fabric_run: usage: fabric_run LABEL PROG [ARGS...]" >&2; return 2; }
    if [ "$JOBS" -ge "$MAX_JOBS" ]; then
        echo "fabric_run: --max-jobs $MAX_JOBS reached, $label not run" >&2
        return 2
    fi
    JOBS=$((JOBS + 1))
    for a in "$@"; do args+=("${a//@VICTIMS@/$FABRIC_VICTIM_RANKS}"); done
    say "job $label: $NRANKS ranks (substrate ${MAILRAIL_SUBSTRATE:-default}${MPI_NET_ARGS:+, MPI over eth0}): ${args[*]}"
    fabric_mark
    # In the background, so that a signal interrupts `wait` and tears down.
    # shellcheck disable=SC2086
    MPIEXEC_TIMEOUT=$JOB_TIMEOUT timeout -k 10 $((JOB_TIMEOUT + 15)) \
        "$MPIEXEC" "${MPI_NET_ARGS[@]}" ${FABRIC_MPIEXEC_ARGS:-} -n "$NRANKS" \
        "$FABRIC_SELF" --rank-wrapper "${args[@]}" &
    JOBPID=$!
    wait "$JOBPID"
    rc=$?
    JOBPID=
    [ "$rc" -eq 0 ] || echo "fabric: job $label exited with status $rc" >&2
    remove_own_segments
    fabric_report "$label"
    return "$rc"
}

fabric_exec() {
    local h=$1 rc
    shift
    is_uint "$h" && [ "$h" -lt "$H" ] || { echo "fabric_exec: no host '$h'" >&2; return 2; }
    timeout -k 5 "$JOB_TIMEOUT" ip netns exec "$(host_ns "$h")" unshare --uts \
        sh -c 'echo "$0" >/proc/sys/kernel/hostname && exec "$@"' "mrf-h$h" "$@"
}

if [ "$MODE" = run ]; then
    label=$(basename "$1")
    fabric_run "$label" "$@"
    exit $?
fi
# shellcheck disable=SC1090
source "$SCRIPT"
