#!/usr/bin/env bash
# Local security as it would be used: a 2-rank job over TCP under the node
# policy runs as an unprivileged uid A, and a second unprivileged uid B
# attacks it while it runs (both are unused uids, picked at random and
# checked against the password database and the running processes):
#  - its memory and environment, where the job's TCP key lives (the key
#    never touches a file: rank 0 draws it and MPI passes it on), and its
#    descriptors and mappings: B reads none of them (A, the owner, reads
#    its environment and mappings, so the checks can fail);
#  - its node credit segment: every rank maps it, and its name is unlinked
#    once every rank of the node has mapped it, so the mapping reads
#    "(deleted)" and /dev/shm has no such name while the job runs; B can
#    neither open it by name nor through /proc/PID/map_files (root can, so
#    that path exists); and /dev/shm holds no file of A that B may read;
#  - its files (its output, in a directory of A's): B reads none;
#  - its TCP ports: a connection of B that answers the rank's nonce with a
#    well-formed AUTH message (magic, version, the other rank's number) whose
#    MAC is wrong is dropped, and the rank logs exactly why; a connection
#    that sends random bytes is dropped too; the job still delivers every
#    message exactly once and exits 0.
# test_unit.c checks the segment itself against another user (owner-only, a
# forgery under the job's name refused).
#
#   run_local_security.sh MPIEXEC MAILRAIL_DEMO
#
# A build directory that uid A cannot reach (under /root, say) is staged in
# the job's directory first. Exits 77 (skipped) without root, setpriv or ss;
# fails instead when MR_TEST_STRICT=1 (-Dstrict_tests, CI).
set -u
. "$(dirname "$0")/skip.sh"
mpiexec=$1 demo=$2
[ "$(id -u)" -eq 0 ] || skip "needs root to run the job and the attacker as two other users"
for t in setpriv ss timeout python3 getent; do
    command -v "$t" >/dev/null 2>&1 || skip "'$t' is missing (Debian: util-linux iproute2)"
done

# Two distinct uids that no account and no process uses.
unused_uid() {
    local u
    for _ in $(seq 100); do
        u=$((20000 + RANDOM % 30000))
        [ "$u" != "${uid_a:-}" ] && ! getent passwd "$u" >/dev/null && ! getent group "$u" >/dev/null &&
            ! pgrep -u "$u" >/dev/null && { echo "$u"; return 0; }
    done
    return 1
}
uid_a=$(unused_uid) && uid_b=$(unused_uid) || { echo "FAIL: found no unused uid"; exit 1; }
as_a() { setpriv --reuid="$uid_a" --regid="$uid_a" --clear-groups "$@"; }
as_b() { setpriv --reuid="$uid_b" --regid="$uid_b" --clear-groups "$@"; }
echo "the job runs as uid $uid_a, the attacker as uid $uid_b"

# The job's directory belongs to A alone.
tmp=$(mktemp -d /tmp/run_local_security.XXXXXX)
chown "$uid_a:$uid_a" "$tmp"
chmod 700 "$tmp"
job= pids=
cleanup() {
    [ -n "$job" ] && kill "$job" 2>/dev/null
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
    # Whatever uid A (unused before this run) left in /dev/shm is this job's.
    find /dev/shm -maxdepth 1 -uid "$uid_a" -delete 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# A build that uid A cannot reach (a checkout under /root, say) is staged: the
# demo, libmailrail and the plugins copied to a directory every user can read,
# found there through LD_LIBRARY_PATH (before the build's RUNPATH) and
# MAILRAIL_PLUGIN_PATH.
stage_env=()
if ! as_a test -x "$demo"; then
    build=$(cd "$(dirname "$demo")/.." && pwd)
    stage=$tmp/stage
    mkdir -p "$stage"
    cp -L "$demo" "$build"/core/runtime/libmailrail.so.0 "$build"/substrates/*/mailrail_substrate_*.so \
        "$build"/core/bootstrap/mailrail_bootstrap_*.so "$stage"/ ||
        { echo "FAIL: cannot stage the build $build for uid $uid_a"; exit 1; }
    chown -R "$uid_a:$uid_a" "$stage"
    demo=$stage/$(basename "$demo")
    stage_env=(LD_LIBRARY_PATH="$stage" MAILRAIL_PLUGIN_PATH="$stage")
    echo "uid $uid_a cannot reach $build: the job runs a staged copy in $stage"
fi
for f in "$demo" "$mpiexec"; do
    as_a sh -c 'command -v "$1" >/dev/null && test -x "$(command -v "$1")"' sh "$f" ||
        skip "uid $uid_a cannot run $f"
done

# MailRail's own ports, known in advance (rank r listens on base + r): MPICH's are
# left alone.
base=$((40000 + $$ % 20000))
# A clean environment (the sanitizers' options of a sanitized build kept).
keep=()
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS; do
    [ -n "${!v:-}" ] && keep+=("$v=${!v}")
done
as_a env -i PATH="$PATH" HOME="$tmp" TMPDIR="$tmp" "${keep[@]}" "${stage_env[@]}" MAILRAIL_SUBSTRATE=tcp MAILRAIL_FLOWCTL=node \
    MAILRAIL_LOG_LEVEL=warn MAILRAIL_TCP_PORT=$base MPIEXEC_TIMEOUT=120 \
    sh -c 'cd "$4" && exec timeout -k 5 150 "$1" -n 2 "$2" 500000 64 >"$3" 2>&1' sh "$mpiexec" "$demo" \
    "$tmp/out" "$tmp" &
job=$!
ports="$base $((base + 1))"
# Until both ranks listen: up to 60 s, since a loaded machine starts MPI slowly.
started=$(date +%s)
while [ $(($(date +%s) - started)) -lt 60 ] && kill -0 "$job" 2>/dev/null; do
    pids=$(pgrep -u "$uid_a" -f "^$demo 500000 64" | tr '\n' ' ')
    [ "$(ss -Hltn "( sport = :$base or sport = :$((base + 1)) )" | wc -l)" -eq 2 ] && break
    pids=
    sleep 0.05
done
[ -n "$pids" ] || { cat "$tmp/out"; echo "FAIL: the job's ranks were never seen listening (after $(($(date +%s) - started)) s)"; exit 1; }
echo "ranks: $pids; MailRail's TCP ports: $ports"

# The checks below must be able to fail: B runs, and A, the owner, can read what B must not.
[ "$(as_b id -u)" = "$uid_b" ] || fail "cannot run commands as uid $uid_b"
segments=
for pid in $pids; do
    [ "$(stat -c %u "/proc/$pid")" = "$uid_a" ] || fail "rank $pid does not run as uid $uid_a"
    as_a cat "/proc/$pid/environ" >/dev/null || fail "the owner cannot read rank $pid's environment"
    as_b cat "/proc/$pid/environ" >/dev/null 2>&1 && fail "uid $uid_b read rank $pid's environment"
    as_b dd if="/proc/$pid/mem" of=/dev/null bs=1 count=1 skip=4096 2>/dev/null &&
        fail "uid $uid_b read rank $pid's memory"
    as_b ls "/proc/$pid/fd" >/dev/null 2>&1 && fail "uid $uid_b listed rank $pid's descriptors"
    as_b cat "/proc/$pid/maps" 2>/dev/null | grep -q . && fail "uid $uid_b read rank $pid's mappings"
    # The segment: mapped by every rank, its name already gone.
    maps=$(as_a cat "/proc/$pid/maps")
    seg=$(printf '%s\n' "$maps" | awk '$6 ~ /^\/dev\/shm\/mailrail-/ { print $1, $6, $7; exit }')
    if [ -z "$seg" ]; then
        fail "rank $pid maps no node credit segment"
        continue
    fi
    read -r range path deleted <<<"$seg"
    segments="$segments $path"
    [ "$deleted" = "(deleted)" ] || fail "rank $pid maps $path, whose name is still there"
    [ -e "$path" ] && fail "$path still exists while the job runs"
    as_b /usr/bin/python3 -c 'import os, sys; os.open(sys.argv[1], os.O_RDONLY)' "$path" 2>/dev/null &&
        fail "uid $uid_b opened $path by name"
    [ -r "/proc/$pid/map_files/$range" ] || fail "root cannot open rank $pid's segment through map_files"
    as_b cat "/proc/$pid/map_files/$range" >/dev/null 2>&1 &&
        fail "uid $uid_b read rank $pid's segment through /proc/$pid/map_files"
done
[ "$(printf '%s\n' $segments | sort -u | wc -l)" -eq 1 ] ||
    fail "the two ranks of one node should map one segment, not: $segments"
echo "both ranks map the node segment$segments, whose name is gone"
for f in /dev/shm/*; do
    [ -e "$f" ] && [ "$(stat -c %u "$f")" = "$uid_a" ] || continue
    as_b cat "$f" >/dev/null 2>&1 && fail "uid $uid_b read $f"
    as_b sh -c ": >> '$f'" 2>/dev/null && fail "uid $uid_b wrote to $f"
done
# Its files.
as_a test -r "$tmp/out" || fail "the owner cannot read the job's output"
as_b cat "$tmp/out" >/dev/null 2>&1 && fail "uid $uid_b read the job's output"
as_b ls "$tmp" >/dev/null 2>&1 && fail "uid $uid_b listed the job's directory"

# Each port: a well-formed AUTH message with a wrong MAC, as the other rank,
# then a connection of random bytes. The rank must close both.
rank=0
for port in $ports; do
    as_b /usr/bin/python3 - "$port" $((1 - rank)) <<'PY' || fail "uid $uid_b's forged AUTH to port $port was not dropped"
import os, socket, struct, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
nonce = b""
while len(nonce) < 16:
    got = s.recv(16 - len(nonce))
    if not got:
        sys.exit("the rank closed before its nonce")
    nonce += got
# "MRAU", version 3, reserved 0, the claimed rank, then 32 bytes that are not the MAC.
s.sendall(struct.pack("<IHHi", 0x4d524155, 3, 0, int(sys.argv[2])) + os.urandom(32))
try:
    while True:
        got = s.recv(4096)
        if not got:
            break
        sys.exit("the rank answered a forged AUTH message with %d bytes" % len(got))
except ConnectionResetError:
    pass
PY
    as_b /usr/bin/python3 - "$port" <<'PY' || fail "uid $uid_b's connection of random bytes to port $port was not dropped"
import os, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(os.urandom(256))
s.settimeout(10)
try:
    while s.recv(4096):
        pass  # The rank sends its nonce first; it must then close.
except ConnectionResetError:
    pass
PY
    rank=$((rank + 1))
done
wait "$job"
rc=$?
job= pids=
cat "$tmp/out"
[ "$rc" -eq 0 ] || fail "the job failed ($rc)"
test "$(grep -c "all delivered exactly once" "$tmp/out")" -eq 2 || fail "not every message arrived once"
rank=0
for port in $ports; do
    grep -Eq "^mailrail\[$rank\] warn: TCP substrate: dropped an incoming connection from 127\.0\.0\.1:[0-9]+: it claims rank $((1 - rank)) but its proof of the job key is wrong\.$" "$tmp/out" ||
        fail "rank $rank did not log that it dropped the forged AUTH message on port $port"
    rank=$((rank + 1))
done
[ "$failures" -eq 0 ] || exit 1
echo "uid $uid_b read nothing of uid $uid_a's job, found no segment name, and its forged handshakes were dropped and logged"
