#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a
# bounded time on a copy of its seed corpus in tests/fuzz/corpus/<target>.
# Any crash, leak, timeout or failed property fails the run.
#
#   tests/fuzz/run_fuzzers.sh [seconds-per-target] [output-dir] [meson-build-dir/flowctl]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-30}
out=${2:-build-fuzz}
# Where meson generated the policy list (flowctl/mr_flowctl_builtin.h).
generated=${3:-build/flowctl}
mkdir -p "$out"
cc="clang -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"
inc="-Icore/base -Icore/include -Icore/plugin -Iflowctl -Iflowctl/node -I$generated -Itools -Isubstrates/common"
core="core/base/config.c core/base/log.c flowctl/flowctl_registry.c flowctl/flowctl_settings.c
      flowctl/credit.c flowctl/none/flowctl_none.c
      flowctl/rank/flowctl_rank.c flowctl/node/flowctl_node.c flowctl/node/node_segment.c
      flowctl/node/node_wake.c"
# Two at a time, compiles and runs alike: each fuzzer has a core of the two to itself.
jobs=2
# Both of the two jobs in the background, each one's failure the script's.
both() {
    local rc=0
    wait -n || rc=1
    wait -n || rc=1
    return $rc
}
build() {
    local target=$1
    shift
    # shellcheck disable=SC2086
    $cc $inc "$@" -o "$out/fuzz_$target"
}
# shellcheck disable=SC2086
build config tests/fuzz/fuzz_config.c $core &
build ygm_trace tests/fuzz/fuzz_ygm_trace.c tools/ygm_trace.c &
both
build tcp_wire -Isubstrates/tcp tests/fuzz/fuzz_tcp_wire.c substrates/tcp/tcp_wire.c -lsodium &
build ucx_wire -Isubstrates/ucx tests/fuzz/fuzz_ucx_wire.c substrates/ucx/ucx_wire.c &
both
build items_wire -Icore/runtime tests/fuzz/fuzz_items_wire.c &
build batch tests/fuzz/fuzz_batch.c substrates/common/mr_batch.c &
both
fuzz() {
    local target=$1 corpus="$out/corpus_$1"
    rm -rf "$corpus"
    cp -r "tests/fuzz/corpus/$target" "$corpus"
    "$out/fuzz_$target" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=1024 \
        -print_final_stats=1 "$corpus" > "$out/fuzz_$target.log" 2>&1
}
targets=(config ygm_trace tcp_wire ucx_wire items_wire batch)
declare -A pid_of
for target in "${targets[@]}"; do
    echo "fuzzing $target for $seconds s"
    [ "$(jobs -pr | wc -l)" -ge "$jobs" ] && { wait -n || true; }
    fuzz "$target" &
    pid_of[$target]=$!
done
status=0
for target in "${targets[@]}"; do
    if ! wait "${pid_of[$target]}"; then
        echo "fuzz_$target failed:"
        tail -40 "$out/fuzz_$target.log"
        status=1
    fi
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$out/fuzz_$target.log" || true
done
exit $status
