/* An in-process stand-in for libibverbs, linked into test_verbs_fake in
 * place of the real library's entry points, so the verbs transport's
 * device, queue-pair, completion and teardown code runs end to end on
 * machines without an RDMA device. Connections must live in one process
 * (threads), since an RDMA write here is a memcpy.
 *
 * It is strict where hardware is strict and checks more than hardware
 * reports: queue-pair transitions need the attribute masks the spec
 * demands, writes need a live MR covering the local range and a remote MR
 * with remote-write access covering the target, PSNs and QP numbers must
 * be wired both ways, queues and completion queues must not overflow,
 * events must be acked before a CQ is destroyed, and everything must be
 * destroyed in a legal order. Violations complete with the error status
 * hardware would give or, for pure misuse, abort with a message. */
#ifndef BRAID_TEST_VERBS_FAKE_H
#define BRAID_TEST_VERBS_FAKE_H

#include <stddef.h>

/* Environment read by the fake at ibv_get_device_list / ibv_query_port:
 *   FAKE_VERBS_DEVICES=0        no devices
 *   FAKE_VERBS_PORT_STATE=DOWN  the port is DOWN
 *   FAKE_VERBS_LINK=IB          an InfiniBand port (LID 7) instead of RoCE
 *   FAKE_VERBS_LID=n            that port's LID (0: no subnet manager) */

/* The calling thread (and only it) sees the port DOWN from now on when
 * down is non-zero: with ranks as threads, one rank's probe fails. */
void verbs_fake_thread_port_down(int down);

/* The calling thread's next INIT->RTR transition fails with this errno
 * (e.g. ETIMEDOUT, as an unreachable address vector gives). */
void verbs_fake_thread_fail_rtr(int err);

/* Live objects (contexts, PDs, MRs, CQs, QPs, channels); 0 after a clean
 * teardown. desc gets a breakdown. */
int verbs_fake_live(char *desc, size_t cap);

/* The next RDMA write to execute completes with this ibv_wc_status (e.g.
 * IBV_WC_RETRY_EXC_ERR) and moves its QP to ERR. */
void verbs_fake_fail_next_write(int status);

/* Work requests executed so far (RDMA writes, sends). */
unsigned long verbs_fake_writes(void);
unsigned long verbs_fake_sends(void);

#endif
