/* Which process a peer on this host is, in terms that survive containers:
 * a pid means something only inside its pid namespace, and two containers
 * on one host may both run a pid 1. Ranks publish their pid with the
 * inode of their pid namespace (/proc/self/ns/pid); a peer's pid is used
 * (compared with ours, signalled, watched through a pidfd) only when the
 * namespaces agree. */
#ifndef BRAID_PROC_ID_H
#define BRAID_PROC_ID_H

#include <stdint.h>

/* The inode of this process's pid namespace; 0 when /proc cannot say
 * (then only pids are compared, as before namespaces). */
uint32_t braid__pidns_self(void);

/* Whether a peer's published pid names a process in our pid namespace,
 * so that kill(), pidfd_open() and comparisons with getpid() mean it. */
static inline int braid__pid_is_ours(uint32_t peer_pidns)
{
    return peer_pidns == braid__pidns_self();
}

/* Whether (pid, pidns) published by a peer is this very process. */
int braid__is_this_process(uint32_t pid, uint32_t pidns);

#endif
