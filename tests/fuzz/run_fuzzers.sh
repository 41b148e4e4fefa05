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
# shellcheck disable=SC2086
$cc $inc tests/fuzz/fuzz_config.c $core -o "$out/fuzz_config"
# shellcheck disable=SC2086
$cc $inc tests/fuzz/fuzz_ygm_trace.c tools/ygm_trace.c -o "$out/fuzz_ygm_trace"
# shellcheck disable=SC2086
$cc $inc -Isubstrates/tcp tests/fuzz/fuzz_tcp_wire.c substrates/tcp/tcp_wire.c \
    -lsodium -o "$out/fuzz_tcp_wire"
# shellcheck disable=SC2086
$cc $inc -Isubstrates/ucx tests/fuzz/fuzz_ucx_wire.c substrates/ucx/ucx_wire.c \
    -o "$out/fuzz_ucx_wire"
# shellcheck disable=SC2086
$cc $inc -Icore/runtime tests/fuzz/fuzz_items_wire.c -o "$out/fuzz_items_wire"
# shellcheck disable=SC2086
$cc $inc tests/fuzz/fuzz_batch.c substrates/common/mr_batch.c -o "$out/fuzz_batch"
status=0
for target in config ygm_trace tcp_wire ucx_wire items_wire batch; do
    corpus="$out/corpus_$target"
    rm -rf "$corpus"
    cp -r "tests/fuzz/corpus/$target" "$corpus"
    echo "fuzzing $target for $seconds s"
    if ! "$out/fuzz_$target" -max_total_time="$seconds" -timeout=5 -rss_limit_mb=1024 \
            -print_final_stats=1 "$corpus" > "$out/fuzz_$target.log" 2>&1; then
        tail -40 "$out/fuzz_$target.log"
        status=1
    fi
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$out/fuzz_$target.log" || true
done
exit $status
