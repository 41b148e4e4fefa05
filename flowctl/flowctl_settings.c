/*
 * Flow control's own settings: which policy, and how every credit policy
 * returns credits. Each policy's credit counts are in its own table.
 */
#include "mr_flowctl.h"

#include <stddef.h>

const mr_config_entry_t mr__flowctl_config_table[] = {
    {"MAILRAIL_FLOWCTL", "none", MR_CONFIG_ENUM, offsetof(mr_flowctl_config_t, policy), 0, 0,
     mr__flowctl_names,
     "The flow-control policy: none sends unconstrained, rank keeps credits per sender and "
     "receiver pair, node shares credits among the ranks of a sending node."},
    {"MAILRAIL_CREDIT_RETURN_THRESHOLD", "2", MR_CONFIG_UINT,
     offsetof(mr_flowctl_config_t, credit_return_threshold), 1, 65536, NULL,
     "Under the rank and node policies, a receiver returns credits to a sender (rank or node) "
     "once it has consumed 1/this of the credits it grants it at a time (the adaptive window, "
     "or the static share): 2 returns them after half. "
     "Larger values return sooner, in more and smaller control messages."},
    {"MAILRAIL_CREDIT_HORIZON_US", "1000", MR_CONFIG_UINT,
     offsetof(mr_flowctl_config_t, credit_horizon_us), 100, 500000, NULL,
     "Under the rank and node policies with adaptive grants, the shortest time (in "
     "microseconds) that a receiver's grants cover at its best recent arrival rate. A longer "
     "one makes larger windows, which need fewer credit returns and so less CPU, but let more "
     "data wait in front of a bottleneck: 1000 keeps about 25 KB in front of a 200 Mbit/s "
     "port, under a 32 KB buffer. Measured credit loops lengthen it (docs/flowctl.md)."},
    {"MAILRAIL_CREDIT_GROW", "yes", MR_CONFIG_BOOL, offsetof(mr_flowctl_config_t, credit_grow),
     0, 0, NULL,
     "Under the rank and node policies with adaptive grants, a send that finds no credit asks "
     "its receiver for more (one control message per wait, per node under node), and the "
     "receiver doubles that sender's window, up to its share, at most once per credit loop; "
     "a window whose senders stop asking halves every 250 ms. no keeps the window at rate x "
     "horizon and sends no asks (docs/flowctl.md)."},
    {"MAILRAIL_PIGGYBACK", "yes", MR_CONFIG_BOOL, offsetof(mr_flowctl_config_t, piggyback), 0, 0,
     NULL,
     "Under the rank and node policies, a data message to a rank also carries the credits "
     "owed to it (to its node, under node), so that fewer control messages are needed."},
    {NULL, NULL, 0, 0, 0, 0, NULL, NULL},
};
