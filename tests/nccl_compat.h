/* What the parts of nccl_compat share: the rank for messages and the
 * checks of a call's result. */
#ifndef BRAID_TEST_NCCL_COMPAT_H
#define BRAID_TEST_NCCL_COMPAT_H

#include <nccl.h>
#include <stdio.h>
#include <string.h>

extern int g_rank;

#define FAIL(...)                                                                                                      \
    do {                                                                                                               \
        fprintf(stderr, "rank %d: %s:%d: ", g_rank, __FILE__, __LINE__);                                              \
        fprintf(stderr, __VA_ARGS__);                                                                                  \
        fputc('\n', stderr);                                                                                           \
        return 1;                                                                                                      \
    } while (0)

#define CHECK(cmd)                                                                                                     \
    do {                                                                                                               \
        ncclResult_t r_ = (cmd);                                                                                       \
        if (r_ != ncclSuccess)                                                                                         \
            FAIL("%s failed: %s: %s", #cmd, ncclGetErrorString(r_), ncclGetLastError(NULL));                           \
    } while (0)

/* A word said twice in a row ("BRAID_ERR_PEER: BRAID_ERR_PEER: ..."), as
 * a status name does when one layer adds it to a text that has it: the
 * word, or NULL. */
const char *doubled_word(const char *text);

/* A specific failure whose text mentions needle and no name twice. */
#define EXPECT(cmd, code, needle)                                                                                      \
    do {                                                                                                               \
        ncclResult_t r_ = (cmd);                                                                                       \
        if (r_ != (code))                                                                                              \
            FAIL("%s returned %s (%s), want %s", #cmd, ncclGetErrorString(r_), ncclGetLastError(NULL),                 \
                 ncclGetErrorString(code));                                                                            \
        if ((needle) && !strstr(ncclGetLastError(NULL), (needle) ? (needle) : ""))                                     \
            FAIL("%s: error text \"%s\" lacks \"%s\"", #cmd, ncclGetLastError(NULL), (needle) ? (needle) : "");       \
        if (doubled_word(ncclGetLastError(NULL)))                                                                      \
            FAIL("%s: error text \"%s\" says \"%s\" twice", #cmd, ncclGetLastError(NULL),                              \
                 doubled_word(ncclGetLastError(NULL)));                                                                \
    } while (0)

/* PreMulSum with a scalar per rank (nccl_compat_premul.c). */
int test_premulsum(ncclComm_t comm, int rank, int n);

#endif
