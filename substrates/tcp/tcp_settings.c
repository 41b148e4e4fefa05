/*
 * The TCP substrate's settings: the MAILRAIL_TCP_* table the core reads into
 * a tcp_config_t (tcp_substrate.h).
 */
#include "tcp_substrate.h"

#include <stddef.h>

const mr_config_entry_t tcp__config_table[] = {
    {.name = "MAILRAIL_TCP_ADDR",
     .default_value = "127.0.0.1",
     .type = MR_CONFIG_STRING,
     .offset = offsetof(tcp_config_t, addr),
     .doc = "The IPv4 address each rank listens on and advertises to its peers, or the name of "
            "a network interface (such as eth0) whose IPv4 address is used. The default, the "
            "loopback address, only connects ranks that run on the same host."},
    {.name = "MAILRAIL_TCP_PORT",
     .default_value = "0",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(tcp_config_t, port),
     .min = 0,
     .max = 65535,
     .doc = "The TCP port to listen on. With 0 the system picks a free port for every rank; "
            "any other value makes rank r listen on this port plus r, which must not exceed "
            "65535."},
    {.name = "MAILRAIL_TCP_AUTH_TIMEOUT",
     .default_value = "5",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(tcp_config_t, auth_timeout_s),
     .min = 1,
     .max = 3600,
     .doc = "Seconds an incoming connection may take to prove that it belongs to the job "
            "before it is closed. Connections that fail or miss this check are dropped, "
            "logged and counted as rejected, and the job carries on."},
    {.name = NULL},
};
