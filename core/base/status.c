/*
 * Names of the status codes.
 */
#include "mailrail.h"

const char *mr_status_string(mr_status_t status)
{
    switch (status) {
    case MR_OK: return "success";
    case MR_AGAIN: return "nothing available now; make progress and try again";
    case MR_ERR_INVALID_PARAM: return "invalid parameter";
    case MR_ERR_INVALID_RANK: return "rank out of range";
    case MR_ERR_MESSAGE_TOO_LONG: return "message longer than the datagram size";
    case MR_ERR_INVALID_BUFFER: return "buffer was not handed out by MailRail";
    case MR_ERR_BUFFER_STATE: return "buffer is not held by the application (double release or already sent)";
    case MR_ERR_NOT_INITIALIZED: return "MailRail is not initialized (called before mr_init or after mr_finalize)";
    case MR_ERR_ALREADY_INITIALIZED: return "MailRail is already initialized";
    case MR_ERR_CONFIG: return "invalid MAILRAIL_* setting";
    case MR_ERR_NO_MEMORY: return "out of memory";
    case MR_ERR_PLUGIN: return "substrate plugin could not be loaded";
    case MR_ERR_BOOTSTRAP: return "bootstrap (MPI) failed";
    case MR_ERR_TRANSPORT: return "transport error";
    case MR_ERR_PEER_FAILED: return "a peer process failed or disconnected";
    case MR_ERR_PROTOCOL: return "malformed message from a peer";
    case MR_ERR_TIMEOUT: return "timed out";
    case MR_ERR_UNSUPPORTED: return "not supported by this build";
    case MR_ERR_SYSTEM: return "the operating system refused a resource (see the log)";
    case MR_ERR_LIMIT: return "a fixed limit of MailRail was reached (see the log)";
    case MR_ERR_IN_HANDLER: return "not allowed inside an active-message handler";
    }
    return "unknown status";
}
