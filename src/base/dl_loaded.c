/* Asking dlopen with RTLD_NOLOAD for a bare soname that is not loaded is
 * not free: glibc still walks the library path, opening each candidate to
 * compare it with the loaded objects (about ten failed opens and a mapping
 * of ld.so.cache). Asked on every collective call on a machine without the
 * CUDA driver, that cost a few hundred microseconds per small all-reduce.
 * The answer can only turn from absent to present when the process loads an
 * object, and the loader counts those (dl_iterate_phdr's dlpi_adds), so an
 * absent answer is kept until that count moves. */
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>

#include "dl_loaded.h"

static int loads_so_far(struct dl_phdr_info *info, size_t size, void *data)
{
    unsigned long long *adds = data;
    /* dlpi_adds exists since glibc 2.4; 0 (ask dlopen every time) if not */
    if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds))
        *adds = info->dlpi_adds;
    return 1; /* every object reports the same count: one is enough */
}

void *braid__dl_if_loaded(const char *soname, braid_dl_probe *probe)
{
    unsigned long long adds = 0;
    dl_iterate_phdr(loads_so_far, &adds);
    if (adds && atomic_load_explicit(&probe->absent_at, memory_order_relaxed) == adds)
        return NULL;
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (!h && adds)
        atomic_store_explicit(&probe->absent_at, adds, memory_order_relaxed);
    return h;
}
