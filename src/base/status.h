/* Error reporting shared by every braid module. */
#ifndef BRAID_STATUS_H
#define BRAID_STATUS_H

#include "braid.h"

/* Record the detail text of a failure in this thread's error buffer, log it
 * at INFO, and return status, so callers can write
 *     return braid__error(BRAID_ERR_PEER, "rank %d: peer %d closed", ...);
 * Call it once, where the error is first detected. The caller of the public
 * call prints braid_last_error(); braid logs at WARN only what no call
 * returns (docs/RELIABILITY.md, "Messages"). */
braid_status braid__error(braid_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Same, without logging: for errors the caller is expected to handle. */
braid_status braid__error_quiet(braid_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clear this thread's error text (called when a public call succeeds). */
void braid__error_clear(void);

/* Copy an error text (e.g. from the progress thread to a waiter). */
void braid__error_set_text(const char *text);

/* This thread's error text without its leading status name: the part to
 * quote when wrapping it in a new error. */
const char *braid__error_detail(void);

/* text without a leading "BRAID_ERR_X: " status name (text itself when it
 * has none): every place that quotes an error text inside another uses
 * this, so that no status name appears twice. */
const char *braid__status_strip(const char *text);

/* Names for messages: "f32", "bf16", "sum", "avg"; "invalid" otherwise. */
const char *braid__dtype_name(braid_dtype dtype);
const char *braid__op_name(braid_op op);

#define BRAID_CHECK_GOTO(call, status, label)                                                  \
    do {                                                                                       \
        (status) = (call);                                                                     \
        if ((status) != BRAID_OK)                                                              \
            goto label;                                                                        \
    } while (0)

#define BRAID_CHECK(call)                                                                      \
    do {                                                                                       \
        braid_status braid__st = (call);                                                       \
        if (braid__st != BRAID_OK)                                                             \
            return braid__st;                                                                  \
    } while (0)

#endif
