/* Stacks of a test process that ran past its deadline, printed before it
 * is killed, so that a hang seen once (in CI, under load) can be read from
 * the log instead of reproduced. */
#ifndef BRAID_TEST_STACK_DUMP_H
#define BRAID_TEST_STACK_DUMP_H

#include <sys/types.h>

/* Every thread's backtrace of pid, on stderr, through gdb (a note instead
 * where gdb is missing or cannot attach); bounded to 60 s. Nothing for a
 * stopped process (SIGSTOP): tests stop ranks on purpose. */
void stack_dump(pid_t pid, const char *what);

/* Waits for child pid up to timeout_s; past it, dumps its stacks and kills
 * it. Returns its exit code, 128 + signal, or 124 after a timeout. */
int stack_dump_wait(pid_t pid, int timeout_s, const char *what);

/* Runs fn in a forked child with a limit of limit_s (stack_dump_wait) and
 * prints "what: ok" or "what: FAILED"; returns 1 when it failed. */
int stack_dump_run_case(int (*fn)(void), const char *what, int limit_s);

#endif
