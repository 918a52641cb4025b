/* Process identities across pid namespaces (proc_id.h). */
#include <sys/stat.h>
#include <unistd.h>

#include "proc_id.h"

uint32_t braid__pidns_self(void)
{
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0)
        return 0;
    /* The namespace inode is a proc inode number: 32 bits. */
    return (uint32_t)st.st_ino;
}

int braid__is_this_process(uint32_t pid, uint32_t pidns)
{
    return pid == (uint32_t)getpid() && braid__pid_is_ours(pidns);
}
