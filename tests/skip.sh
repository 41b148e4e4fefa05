# Sourced by the test scripts that need what a machine may lack (root, tools):
# skip REASON exits 77 (meson: skipped), or fails under MR_TEST_STRICT=1
# (-Dstrict_tests, CI), where nothing may pass by being skipped.
skip() {
    if [ "${MR_TEST_STRICT:-0}" = 1 ]; then echo "FAIL (strict_tests): $*"; exit 1; fi
    echo "SKIP: $*"; exit 77
}
