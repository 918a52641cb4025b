/* Environment parameters: one table (param.c) with every variable the
 * library reads: its kind, accepted range, default and help. It is the
 * single source of truth: docs/CONFIG.md's table is generated from it
 * (scripts/config-doc) and tests/test_params.c fails when the sources read
 * a variable the table lacks or the document differs from the table.
 *
 * Parsing is strict and the same everywhere: integers are decimal (a
 * leading zero is not octal, "0x" is not hex), optionally negative, with
 * an overflow check; sizes also take a K, M or G suffix (checked for
 * overflow too); booleans are 1/0, yes/no, true/false, on/off (any case);
 * choices are one of a listed set of words (any case), and so is each
 * entry of a list. */
#ifndef BRAID_PARAM_H
#define BRAID_PARAM_H

#include <stddef.h>
#include <stdio.h>

#include "status.h"

/* Largest group: braid_pg_init and the launcher variables of
 * braid_pg_init_env (WORLD_SIZE, ...) share this limit. */
#define BRAID_MAX_RANKS 65536

typedef enum {
    BRAID_PARAM_STR,    /* free text */
    BRAID_PARAM_CHOICE, /* one of `choices` ("a|b|c") */
    BRAID_PARAM_INT,    /* decimal integer in [min, max] */
    BRAID_PARAM_SIZE,   /* like INT, with an optional K/M/G suffix (x1024^n) */
    BRAID_PARAM_BOOL,   /* 1/0, yes/no, true/false, on/off */
    BRAID_PARAM_LIST,   /* comma-separated words, each one of `choices` */
} braid_param_kind;

/* Where a variable belongs, which decides when it is checked: BRAID_*
 * variables at every group creation, launcher variables by
 * braid_pg_init_env where it reads them, test hooks never up front. */
typedef enum {
    BRAID_PARAM_CORE,     /* general knobs */
    BRAID_PARAM_VERBS,    /* RDMA verbs transport */
    BRAID_PARAM_LAUNCHER, /* set by torchrun, mpirun, srun */
    BRAID_PARAM_TEST,     /* test hooks, not for production: read by fault_inject.c only */
    BRAID_PARAM_SECTION_COUNT
} braid_param_section;

typedef struct {
    const char *name;
    braid_param_kind kind;
    braid_param_section section;
    long long min, max;        /* INT, SIZE */
    const char *choices;       /* CHOICE, LIST: "|"-separated words */
    const char *default_value; /* as documented; NULL: unset means "automatic", see help */
    const char *help;          /* markdown, one line */
} braid_param_info;

extern const braid_param_info braid__params[];
extern const size_t braid__param_count;

/* The table entry of name, or NULL. */
const braid_param_info *braid__param_find(const char *name);

/* Strict decimal integer for launcher-style parsers: like strtol(text,
 * end, 10) but without leading blanks or '+', and with ERANGE on overflow
 * and EINVAL when no digit starts the text (errno set, *end at the first
 * character not used). */
long braid__param_decimal(const char *text, char **end);

/* Parse text as the value of p (any kind). BRAID_OK with *out set (an
 * integer, or 0/1 for a boolean, or the index of the choice; 0 for
 * text), else BRAID_ERR_INVALID_ARG naming the variable, the value and
 * what it accepts. */
braid_status braid__param_parse(const braid_param_info *p, const char *text, long long *out);

/* Check every set variable of the table at once (test hooks and, unless
 * launcher is 1, launcher variables left out). BRAID_ERR_INVALID_ARG whose
 * text lists every bad one. The first call in a process also warns about
 * each BRAID_* variable that braid does not know (a misspelling, say),
 * naming the nearest one it does. */
braid_status braid__params_check(int launcher);

/* The known variable nearest to an unknown name (a few edits at most), or
 * NULL: for "did you mean". */
const char *braid__param_nearest(const char *name);

/* 1 for a BRAID_* name that braid's tools read, not the library (the
 * Python package's BRAID_LIBRARY, benchmark scripts, test suites): never
 * called unknown. */
int braid__param_tool_name(const char *name);

/* Integer (or boolean as 0/1) value of an environment parameter, or def
 * when unset. An invalid value (the group creation already refused it,
 * so only seen by code that runs earlier) is logged and def used. */
long long braid__param_int(const char *name, long long def);

/* Boolean value, or def when unset (invalid: as braid__param_int). */
int braid__param_bool(const char *name, int def);

/* String value, or NULL when unset or empty. */
const char *braid__param_str(const char *name);

/* docs/CONFIG.md's tables (param_doc.c), markdown. */
void braid__params_markdown(FILE *out);

/* BRAID_SPIN_US, read once: how long a transport retries before it sleeps.
 * A loopback or LAN reply often arrives within tens of microseconds, and a
 * sleep and wake-up costs about as much as moving a small message. */
int braid__spin_us(void);

#endif
