/* Environment parameters: one table (param.c) with name, default and help,
 * so `braid-bench --params` and docs list the same knobs the code reads. */
#ifndef BRAID_PARAM_H
#define BRAID_PARAM_H

#include <stddef.h>

typedef struct {
    const char *name;
    const char *default_value; /* NULL: unset */
    const char *help;
} braid_param_info;

extern const braid_param_info braid__params[];
extern const size_t braid__param_count;

/* Integer value of an environment parameter, or def when unset/invalid
 * (an invalid value is logged once). Accepts K/M/G suffixes. */
long long braid__param_int(const char *name, long long def);

/* String value, or NULL when unset or empty. */
const char *braid__param_str(const char *name);

/* BRAID_SPIN_US, read once: how long a transport retries before it sleeps.
 * A loopback or LAN reply often arrives within tens of microseconds, and a
 * sleep and wake-up costs about as much as moving a small message. */
int braid__spin_us(void);

#endif
