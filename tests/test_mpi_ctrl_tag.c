/*
 * Unit tests of the MPI substrate's control tags (substrates/mpi/mpi_ctrl_tag.h):
 * every immediate, split into tags within MPI_TAG_UB and put together again,
 * comes out whole, including the values that flow control and the core put
 * in the high bits (a node's totals, asks for credit, failure notices).
 * Single process, no MPI.
 */
#include "mpi_ctrl_tag.h"

#include <check.h>
#include <stdlib.h>

static const uint32_t imms[] = {0,           1,           32767,       32768,
                                0x07ffffffu, 0x08000000u, 0x3fffffffu, 0x40000000u,
                                0x80000005u, 0xdeadbeefu, 0xffffffffu};

/* MPICH's ch4 bound (2^28 - 1), the standard's least (32767), and 2^31 - 1. */
static const struct {
    uint64_t tag_ub;
    unsigned bits;
} bounds[] = {{268435455u, 27}, {32767u, 14}, {2147483647u, 30}};

START_TEST(ctrl_tags_carry_every_immediate_whole)
{
    for (size_t b = 0; b < sizeof(bounds) / sizeof(bounds[0]); b++) {
        unsigned bits = mpi__ctrl_tag_bits(bounds[b].tag_ub);
        ck_assert_uint_eq(bits, bounds[b].bits);
        for (size_t i = 0; i < sizeof(imms) / sizeof(imms[0]); i++) {
            size_t parts = mpi__ctrl_tag_parts(bits, imms[i]);
            uint32_t acc = 0, got = 0;
            int done = 0;

            /* One tag for what fits below the `more` bit, itself. */
            if (imms[i] < (1u << bits)) {
                ck_assert_uint_eq(parts, 1);
                ck_assert_uint_eq(mpi__ctrl_tag_part(bits, imms[i], 0), imms[i]);
            }
            for (size_t p = parts; p-- > 0;) {
                uint32_t tag = mpi__ctrl_tag_part(bits, imms[i], p);
                ck_assert_msg(tag <= bounds[b].tag_ub, "tag %u above %llu", tag,
                              (unsigned long long)bounds[b].tag_ub);
                ck_assert_int_eq(done, 0);
                done = mpi__ctrl_tag_join(bits, &acc, tag, &got);
            }
            ck_assert_msg(done && got == imms[i], "bound %llu: 0x%x came out as 0x%x",
                          (unsigned long long)bounds[b].tag_ub, imms[i], got);
            ck_assert_uint_eq(acc, 0);
        }
    }
    /* 32 bits in 27-bit parts: 2; in 14-bit parts: 3. */
    ck_assert_uint_eq(mpi__ctrl_tag_parts(27, 0xffffffffu), 2);
    ck_assert_uint_eq(mpi__ctrl_tag_parts(14, 0xffffffffu), 3);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mpi-ctrl-tag");
    TCase *tc = tcase_create("tags");
    SRunner *sr;
    int failed;

    tcase_add_test(tc, ctrl_tags_carry_every_immediate_whole);
    suite_add_tcase(s, tc);
    sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
