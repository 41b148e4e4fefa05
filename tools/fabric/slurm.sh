#!/usr/bin/env bash
# slurm.sh: a Slurm cluster on the emulated hosts of tools/fabric/fabric.sh, for
# running MailRail jobs with srun and sbatch as on a real cluster.
#
# Usage (as root):
#   tools/fabric/slurm.sh [options] -- CMD [ARGS...]
#       builds the fabric and the cluster, runs CMD on the login host (host 0:
#       its network namespace, host name mrf-h0, SLURM_CONF set), e.g.
#       `-- srun -N 3 --ntasks-per-node=2 --mpi=pmi2 build/tools/mailrail_demo`,
#       tears everything down; exits with CMD's status.
#   tools/fabric/slurm.sh [options] --script FILE [SCRIPT-ARGS...]
#       builds the fabric and the cluster once and sources the bash FILE, in which
#       fabric.sh's functions (fabric_substrate, fabric_exec, fabric_addr, ...) and
#       these run:
#         slurm_login CMD [ARGS...]     CMD on the login host (see above), bounded
#                                       by --timeout; srun, sbatch, sinfo, squeue...
#         slurm_srun LABEL SRUN-ARGS... `srun --mpi=pmi2 SRUN-ARGS` on the login host,
#                                       bounded by --timeout (srun's own --time too)
#         slurm_check                   every node idle (sinfo), or returns 1
#       and SLURM_DIR (the cluster's private directory), SLURM_CONF, SLURM_NODES
#       (mrf-h[0-N]) are exported. Variables exported before a job reach its ranks
#       (srun --export=ALL), e.g. `MAILRAIL_FLOWCTL=node slurm_srun ...`.
#   tools/fabric/slurm.sh --reap
#       fabric.sh --reap: the namespaces mrf<PID>*, cgroups and /tmp/mrf<PID>.*
#       directories (which hold the cluster's files) of runs killed with SIGKILL.
#
# Options:
#   -H N              emulated hosts = Slurm nodes (default 3; 2..32)
#   -C N              CPUs each node declares (default 4; 1..256): slurm.conf's CPUs,
#                     taken as they are (SlurmdParameters=config_overrides), and
#                     fabric.sh's -R
#   --substrate S     tcp, ucx or none, as fabric.sh (default tcp)
#   --timeout SECONDS bound of each command (default 120)
#   --total-timeout SECONDS  bound of the whole run (default 600)
#   --cpu host|shared  as fabric.sh: host puts each slurmd, and so its jobs, in its
#                     host's CPU cgroup (default host)
#   -V, --victim-ranks, --rate, --buffer, --subnet, --counters, -q   passed to
#                     fabric.sh (default -V 0: no victim host; with -V the last hosts
#                     are victims, their switch ports shallow, and fabric_mark,
#                     fabric_report and $FABRIC_PORT_COUNTERS work as under fabric.sh)
#
# The cluster. fabric.sh builds H hosts (network namespaces mrf<PID>h<h> on a
# bridge, 10.213.K.(h+1), no route out); this file, sourced by
# fabric.sh --script, then starts in a private directory /tmp/mrf<PID>.*/slurm:
#   - munged (host 0's namespace) with a key generated for the run, its own
#     socket, pid, log and seed files; Slurm finds it through AuthInfo=socket=
#   - slurmctld (host 0, the head node, which is also a compute node), state in
#     the private directory, -c (no state from before)
#   - one slurmd per host, in the host's network namespace and a UTS namespace
#     named mrf-h<h> (= its NodeName), with its own spool and pid file, and in
#     the host's CPU cgroup (--cpu host); the tasks it starts inherit all three,
#     so MailRail sees one node per host by host name.
# Every daemon runs in a mount namespace of its own in which a hosts file of the
# run is bound over /etc/hosts (mrf-h<h> -> 10.213.K.(h+1)); nothing is written
# to /etc. slurm.conf: SlurmUser=root, ProctrackType=proctrack/linuxproc,
# TaskPlugin=task/none, no accounting, select/cons_tres with CR_CPU, MpiDefault=
# pmi2 (MPICH's PMI-1 client speaks to Slurm's pmi2 plugin, docs/launch.md).
# All daemons run inside the fabric's namespaces: fabric.sh's teardown (exit,
# failure, SIGINT, SIGTERM, --total-timeout) kills them with everything else there
# and removes the private directory with its run directory.
#
# Needs root, fabric.sh's tools (iproute2, ethtool, util-linux, mpich) and the
# Debian packages slurmctld slurmd slurm-client munge. The packages' own system
# services are never used (and need not run).
set -o pipefail

SLURM_SELF=$(readlink -f "${BASH_SOURCE[0]}")

# ---------------------------------------------------------------------------
# Sourced by fabric.sh --script: the cluster, then the command or the user file.
# ---------------------------------------------------------------------------
if [ "${BASH_SOURCE[0]}" != "$0" ] && [ -n "${FABRIC_NS_PREFIX:-}" ]; then
    slurm_mode=$1 slurm_nodes_n=$2 slurm_cpus=$3 slurm_timeout=$4
    shift 4
    slurm_fail() { echo "slurm.sh: $*" >&2; [ -n "${SLURM_DIR:-}" ] && slurm_logs; exit 1; }
    slurm_logs() {
        local f
        for f in "$SLURM_DIR"/log/*; do
            [ -s "$f" ] || continue
            echo "--- $f (last lines)" >&2
            tail -n 15 "$f" >&2
        done
    }
    SLURM_DIR=$FABRIC_RUNDIR/slurm
    # In fabric.sh's run directory (mode 0700, root's).
    mkdir -p "$SLURM_DIR"/{munge,log,ctld,spool} || slurm_fail "cannot create $SLURM_DIR"
    net=$(fabric_addr 0); net=${net%.*}
    last=$((slurm_nodes_n - 1))
    export SLURM_NODES="mrf-h[0-$last]"
    export SLURM_CONF=$SLURM_DIR/slurm.conf

    # The hosts file bound over /etc/hosts in the daemons' mount namespaces.
    { echo "127.0.0.1 localhost"
      for ((h = 0; h < slurm_nodes_n; h++)); do echo "$net.$((h + 1)) mrf-h$h"; done
    } >"$SLURM_DIR/hosts"

    # munge: a key of the run only.
    if ! dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none ||
        ! chmod 0400 "$SLURM_DIR/munge/munge.key"; then
        slurm_fail "cannot write the munge key"
    fi
    MUNGE_SOCKET=$SLURM_DIR/munge/munge.socket

    cat >"$SLURM_CONF" <<EOF
# Generated by tools/fabric/slurm.sh for run $FABRIC_NS_PREFIX; removed with it.
ClusterName=mrf
SlurmctldHost=mrf-h0($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$SLURM_DIR/ctld
SlurmdSpoolDir=$SLURM_DIR/spool/%n
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.%n.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmi2
ReturnToService=2
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=60
PlugStackConfig=$SLURM_DIR/plugstack.conf
NodeName=DEFAULT CPUs=$slurm_cpus RealMemory=1000 State=UNKNOWN
EOF
    for ((h = 0; h < slurm_nodes_n; h++)); do
        echo "NodeName=mrf-h$h NodeAddr=$net.$((h + 1))" >>"$SLURM_CONF"
    done
    echo "PartitionName=fabric Nodes=$SLURM_NODES Default=YES MaxTime=60 State=UP" >>"$SLURM_CONF"
    : >"$SLURM_DIR/plugstack.conf"
    # slurmd loads a cgroup plugin whatever the other plugins: name it, so that it
    # does not autodetect (which fails: `ip netns exec` mounts a /sys without the
    # cgroup tree). Nothing here uses it: proctrack/linuxproc, task/none.
    echo "CgroupPlugin=cgroup/v1" >"$SLURM_DIR/cgroup.conf"

    # CMD in host H's network namespace, a UTS namespace named mrf-h<H>, a mount
    # namespace with the run's hosts file, and (CG=1) the host's CPU cgroup.
    slurm_in_host() {
        local h=$1 cg=$2
        shift 2
        # The cgroup first: `ip netns exec` remounts /sys, without the cgroup tree.
        sh -c 'cg=$1; shift; if [ -n "$cg" ]; then echo $$ >"$cg/cgroup.procs" || exit 2; fi; exec "$@"' \
            sh "$cg" ip netns exec "${FABRIC_NS_PREFIX}h$h" unshare --uts --mount --propagation private \
            sh -c 'h=$1 hosts=$2; shift 2
                   echo "mrf-h$h" >/proc/sys/kernel/hostname &&
                   mount --bind "$hosts" /etc/hosts && exec "$@"' \
            sh "$h" "$SLURM_DIR/hosts" "$@"
    }
    cg_of() { [ -n "${FABRIC_CGROUP:-}" ] && echo "$FABRIC_CGROUP/h$1"; }

    say "slurm: munged, slurmctld on mrf-h0, slurmd on $SLURM_NODES ($slurm_cpus CPUs each), files in $SLURM_DIR"
    slurm_in_host 0 "" munged -F --key-file="$SLURM_DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$SLURM_DIR/munge/munged.pid" --log-file="$SLURM_DIR/log/munged.log" \
        --seed-file="$SLURM_DIR/munge/munged.seed" --force </dev/null >>"$SLURM_DIR/log/munged.out" 2>&1 &
    for _ in $(seq 50); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.2; done
    [ -S "$MUNGE_SOCKET" ] || slurm_fail "munged did not start"
    munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" >/dev/null ||
        slurm_fail "munge/unmunge through $MUNGE_SOCKET failed"

    slurm_in_host 0 "" slurmctld -D -c -f "$SLURM_CONF" </dev/null >>"$SLURM_DIR/log/slurmctld.out" 2>&1 &
    for ((h = 0; h < slurm_nodes_n; h++)); do
        mkdir -p "$SLURM_DIR/spool/mrf-h$h"
        slurm_in_host "$h" "$(cg_of "$h")" slurmd -D -f "$SLURM_CONF" -N "mrf-h$h" \
            </dev/null >>"$SLURM_DIR/log/slurmd.mrf-h$h.out" 2>&1 &
    done

    # CMD on the login host (host 0), bounded by --timeout. In the background
    # (fabric.sh's JOBPID), so that a signal interrupts `wait` and tears down.
    slurm_login() {
        local rc
        timeout -k 5 "$slurm_timeout" \
            ip netns exec "${FABRIC_NS_PREFIX}h0" unshare --uts --mount --propagation private \
            sh -c 'echo mrf-h0 >/proc/sys/kernel/hostname && mount --bind "$0" /etc/hosts && exec "$@"' \
            "$SLURM_DIR/hosts" "$@" &
        JOBPID=$!
        wait "$JOBPID"
        rc=$?
        JOBPID=
        return "$rc"
    }
    slurm_check() {
        local out
        out=$(slurm_login sinfo -h -N -o '%N %t' 2>&1) || return 1
        [ "$(awk '$2 == "idle"' <<<"$out" | sort -u | wc -l)" -eq "$slurm_nodes_n" ]
    }
    slurm_srun() {
        local label=$1 rc
        shift
        say "srun $label: $*"
        slurm_login srun --mpi=pmi2 --time=$(((slurm_timeout + 59) / 60)) -J "$label" "$@"
        rc=$?
        [ "$rc" -eq 0 ] || echo "slurm: srun $label exited with status $rc" >&2
        return "$rc"
    }
    up=0
    for _ in $(seq 60); do
        if slurm_check; then up=1; break; fi
        sleep 0.5
    done
    [ "$up" -eq 1 ] || { slurm_login sinfo -N 2>&1 >&2; slurm_fail "not every node became idle within 30 s"; }
    [ "${QUIET:-0}" -eq 1 ] || slurm_login sinfo -N -o '%N %T %c %P' >&2
    say "slurm: $slurm_nodes_n nodes idle"

    if [ "$slurm_mode" = run ]; then
        slurm_login "$@"
        exit $?
    fi
    slurm_script=$1
    shift
    # shellcheck disable=SC1090
    source "$slurm_script"
    return $?
fi

# ---------------------------------------------------------------------------
# Run directly: options, checks, then fabric.sh --script this file.
# ---------------------------------------------------------------------------
die() { echo "slurm.sh: $*" >&2; exit 1; }
usage() { sed -n '2,/^set -o pipefail/p' "$SLURM_SELF" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
need_arg() { [ $# -ge 2 ] || die "option $1 needs a value"; }
is_uint() { case "$1" in ''|*[!0-9]*) return 1 ;; esac; }
FABRIC=$(dirname "$SLURM_SELF")/fabric.sh

H=3 C=4 SUBSTRATE=tcp TIMEOUT=120 TOTAL=600 CPU=host MODE='' SCRIPT='' PASS=()
while [ $# -gt 0 ]; do
    case "$1" in
        -H) need_arg "$@"; H=$2; shift 2 ;;
        -C) need_arg "$@"; C=$2; shift 2 ;;
        --substrate) need_arg "$@"; SUBSTRATE=$2; shift 2 ;;
        --timeout) need_arg "$@"; TIMEOUT=$2; shift 2 ;;
        --total-timeout) need_arg "$@"; TOTAL=$2; shift 2 ;;
        --cpu) need_arg "$@"; CPU=$2; shift 2 ;;
        -V|--victim-ranks|--rate|--buffer|--subnet|--counters) need_arg "$@"; PASS+=("$1" "$2"); shift 2 ;;
        -q) PASS+=(-q); shift ;;
        --reap) exec "$FABRIC" --reap ;;
        --script) need_arg "$@"; MODE=script; SCRIPT=$2; shift 2; break ;;
        --) MODE=run; shift; break ;;
        -h|--help) usage ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ -n "$MODE" ] || die "nothing to run: give -- CMD [ARGS] or --script FILE (see --help)"
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, daemons in them)"
for v in H C TIMEOUT TOTAL; do is_uint "${!v}" || die "$v must be a non-negative integer"; done
[ "$H" -ge 2 ] && [ "$H" -le 32 ] || die "-H must be 2..32"
[ "$C" -ge 1 ] && [ "$C" -le 256 ] || die "-C must be 1..256"
[ "$TIMEOUT" -ge 1 ] && [ "$TOTAL" -gt "$TIMEOUT" ] || die "need 1 <= --timeout < --total-timeout"
missing=()
for t in slurmctld slurmd srun sbatch sinfo munged munge unmunge ip tc ethtool unshare timeout mount; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
done
[ ${#missing[@]} -eq 0 ] ||
    die "missing: ${missing[*]} (Debian packages: slurmctld slurmd slurm-client munge iproute2 ethtool util-linux mount)"
if [ "$MODE" = run ]; then
    [ $# -ge 1 ] || die "no command after --"
else
    [ -f "$SCRIPT" ] && [ -r "$SCRIPT" ] || die "cannot read script '$SCRIPT'"
    SCRIPT=$(readlink -f "$SCRIPT")
    set -- "$SCRIPT" "$@"
fi
# Same PID: fabric.sh names the namespaces and the run directory after it.
exec "$FABRIC" -H "$H" -R "$C" -V 0 --substrate "$SUBSTRATE" --cpu "$CPU" \
    --timeout "$TIMEOUT" --total-timeout "$TOTAL" "${PASS[@]}" \
    --script "$SLURM_SELF" "$MODE" "$H" "$C" "$TIMEOUT" "$@"
