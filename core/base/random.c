/* Random bytes from the kernel (see mr_random.h). */
#include "mr_random.h"

#include <errno.h>
#include <stdint.h>
#include <sys/random.h>
#include <sys/types.h>

bool mr__random_bytes(void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t got = 0;

    while (got < len) {
        ssize_t n = getrandom(p + got, len - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        got += (size_t)n;
    }
    return true;
}
