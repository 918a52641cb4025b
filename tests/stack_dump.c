/* stack_dump.h: gdb in batch mode, attached from a forked child. */
#include "stack_dump.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Whether pid is stopped (SIGSTOP): a test that stops a rank on purpose
 * lets its deadline kill it, and its stacks say nothing. */
static int is_stopped(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *paren = strrchr(buf, ')'); /* the state follows the command name */
    return paren && (paren[1] == ' ') && (paren[2] == 'T' || paren[2] == 't');
}

void stack_dump(pid_t pid, const char *what)
{
    if (is_stopped(pid))
        return;
    char target[32];
    snprintf(target, sizeof(target), "%d", (int)pid);
    fprintf(stderr, "---- %s (pid %d) still running: its threads ----\n", what, (int)pid);
    fflush(NULL);
    pid_t g = fork();
    if (g == 0) {
        dup2(2, 1); /* the test's log keeps stderr */
        execlp("timeout", "timeout", "60", "gdb", "-batch", "-nx", "-q", "-p", target, "-ex",
               "thread apply all bt", (char *)NULL);
        fprintf(stderr, "(no stacks: cannot run gdb)\n");
        _exit(127);
    }
    int status = 0;
    if (g > 0)
        waitpid(g, &status, 0);
    if (g < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "(gdb did not finish cleanly: status %d)\n", status);
    fprintf(stderr, "---- end of pid %d ----\n", (int)pid);
}

int stack_dump_wait(pid_t pid, int timeout_s, const char *what)
{
    double deadline = now_s() + timeout_s;
    for (;;) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (now_s() > deadline) {
            stack_dump(pid, what);
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 124;
        }
        usleep(2000);
    }
}

int stack_dump_run_case(int (*fn)(void), const char *what, int limit_s)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        int rc = fn();
        fflush(NULL);
        _exit(rc);
    }
    int rc = p < 0 ? 1 : stack_dump_wait(p, limit_s, what);
    printf("%s: %s%s\n", what, rc ? "FAILED" : "ok", rc == 124 ? " (still running: killed)" : "");
    return rc != 0;
}
