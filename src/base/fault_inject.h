/* Fault injection for tests: the one place the library reads its test
 * hooks (the TEST section of src/base/param.c's table). Each function is named
 * for the fault it injects and says whether, or where, to inject it; the
 * code that injects it stays with the module it breaks. In production
 * none of these variables is set and every function answers "never". */
#ifndef BRAID_FAULT_INJECT_H
#define BRAID_FAULT_INJECT_H

/* BRAID_TEST_CORRUPT_CHUNK=K: flip one bit of the K-th non-empty message
 * this process receives with checksums on (transports/checksum/checksum.c). K, or 0 for
 * never. */
long long braid__fault_corrupt_chunk_at(void);

/* BRAID_TEST_EXIT_IN_INIT=STEP: exit the process (_exit(3)) when group
 * formation reaches STEP ("joined": every rank reached the store), as a
 * rank that dies while the group forms. Returns when it does not. */
void braid__fault_exit_in_init(const char *step);

/* CUDA_FAKE_DIRECT=1, in builds against tests/cuda_fake.c: take every
 * connection as one that moves device memory itself (cuda/device_ring.c).
 * 1 when set, else 0. */
int braid__fault_cuda_direct(void);

#endif
