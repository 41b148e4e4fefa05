/*
 * Random bytes from the kernel. Depends on nothing but libc, so that both the
 * substrate plugins and the core can compile it in. Internal.
 */
#ifndef MR_RANDOM_H
#define MR_RANDOM_H

#include <stdbool.h>
#include <stddef.h>

/* Fills `buf` with `len` bytes from getrandom(); false (errno set) if it fails. */
bool mr__random_bytes(void *buf, size_t len);

#endif /* MR_RANDOM_H */
