/*
 * The MPI substrate's settings: the table the core reads MAILRAIL_MAX_RECVS
 * and MAILRAIL_MPI_SEND_WINDOW through, into an mpi_config_t.
 */
#include "mpi_substrate.h"

#include <stddef.h>

const mr_config_entry_t mpi__config_table[] = {
    {.name = "MAILRAIL_MAX_RECVS",
     .default_value = "0",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(mpi_config_t, max_recvs),
     .min = 0,
     .max = 65536,
     .doc = "The most receives the MPI substrate keeps posted at once (at most "
            "MAILRAIL_RECV_SLOTS), each into a staging buffer of MAILRAIL_DATAGRAM_SIZE bytes; "
            "twice this many buffers are allocated at init, since the application holds "
            "received messages in them (zero copy). Messages beyond the posted receives wait "
            "inside MPI. 0: as many as 2 MiB of datagrams, at least 16 and at most 256 (256 "
            "with 4 KiB datagrams). Keep it at least twice MAILRAIL_MPI_SEND_WINDOW, or a fast "
            "sender's small messages land in MPI's unexpected queue and are copied twice."},
    {.name = "MAILRAIL_MPI_SEND_WINDOW",
     .default_value = "128",
     .type = MR_CONFIG_UINT,
     .offset = offsetof(mpi_config_t, send_window),
     .min = 0,
     .max = 1048576,
     .doc = "The most data messages the MPI substrate sends to one rank before MPI confirms "
            "that the receiver matched the older ones (every window/4-th message is an "
            "MPI_Issend whose completion confirms it; below 8, every message is); 0 sends "
            "without limit, letting a fast sender fill the receiver's unexpected-message "
            "queue."},
    {.name = NULL},
};
