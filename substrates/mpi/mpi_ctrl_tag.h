/*
 * The MPI substrate's control tags (docs/substrate-mpi.md): how a 32-bit
 * immediate travels in tags of at most MPI_TAG_UB. Pure functions, no MPI,
 * so that the unit tests run the very code the plugin uses. Internal.
 *
 * A tag's highest bit within the bound (`more`, 1 << bits) says that more
 * parts follow; the bits below it carry the immediate, the highest bits
 * first. An immediate below `more` is one tag, itself.
 */
#ifndef MPI_CTRL_TAG_H
#define MPI_CTRL_TAG_H

#include <stddef.h>
#include <stdint.h>

/* The bits a control tag carries under `tag_ub` (at least 32767: 14). */
static inline unsigned mpi__ctrl_tag_bits(uint64_t tag_ub)
{
    unsigned bits = 1;

    while ((2ull << (bits + 1)) - 1 <= tag_ub) bits++;
    return bits;
}

/* The tags needed to carry `imm`, one at least. */
static inline size_t mpi__ctrl_tag_parts(unsigned bits, uint32_t imm)
{
    size_t n = 1;

    for (uint32_t high = imm >> bits; high != 0; high >>= bits) n++;
    return n;
}

/* Part `i` of `imm` counted from the last (0), with the `more` bit on all but it. */
static inline uint32_t mpi__ctrl_tag_part(unsigned bits, uint32_t imm, size_t i)
{
    uint32_t more = 1u << bits;
    uint32_t tag = (uint32_t)(((uint64_t)imm >> (bits * i)) & (more - 1));

    return i > 0 ? tag | more : tag;
}

/*
 * Adds `tag` to a source's parts so far (*acc, 0 to start): true, with the
 * whole immediate in *imm and *acc back to 0, when it was the last part.
 */
static inline int mpi__ctrl_tag_join(unsigned bits, uint32_t *acc, uint32_t tag, uint32_t *imm)
{
    uint32_t more = 1u << bits;
    uint32_t value = (uint32_t)(((uint64_t)*acc << bits) | (tag & (more - 1)));

    if ((tag & more) != 0) {
        *acc = value;
        return 0;
    }
    *acc = 0;
    *imm = value;
    return 1;
}

#endif /* MPI_CTRL_TAG_H */
