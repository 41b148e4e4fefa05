/*
 * What the generators of the seed corpora (make_*_corpus.c) share: an input
 * built up in memory and written to a file of the corpus directory.
 */
#ifndef MR_FUZZ_CORPUS_H
#define MR_FUZZ_CORPUS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CORPUS_MAX (64 * 1024)

typedef struct corpus_input {
    uint8_t bytes[CORPUS_MAX];
    size_t len;
} corpus_input_t;

/* The corpus directory, the generator's one argument; exits with a usage line without it. */
static inline const char *corpus_dir(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s corpus-directory\n", argv[0]);
        exit(2);
    }
    return argv[1];
}

/* Appends `n` bytes to the input; aborts past CORPUS_MAX. */
static inline void corpus_put(corpus_input_t *in, const void *p, size_t n)
{
    if (in->len + n > CORPUS_MAX) abort();
    memcpy(in->bytes + in->len, p, n);
    in->len += n;
}

/* Writes the input to `dir`/`name`; exits on failure. */
static inline void corpus_write(const char *dir, const char *name, const corpus_input_t *in)
{
    char path[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(in->bytes, 1, in->len, f) != in->len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

#endif /* MR_FUZZ_CORPUS_H */
