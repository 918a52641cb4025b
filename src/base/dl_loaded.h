/* Is a shared library already loaded in this process? For code that must
 * use a library (the CUDA driver) only when the program loaded it. */
#ifndef BRAID_DL_LOADED_H
#define BRAID_DL_LOADED_H

#include <stdatomic.h>

/* One per call site (static, zero-initialized): remembers an "absent"
 * answer until the process loads another object. */
typedef struct {
    atomic_ullong absent_at; /* the loader's object count when last found absent; 0: never */
} braid_dl_probe;

/* dlopen(soname, RTLD_NOW | RTLD_NOLOAD): the library's handle if it is
 * loaded, else NULL. Never loads anything. */
void *braid__dl_if_loaded(const char *soname, braid_dl_probe *probe);

#endif
