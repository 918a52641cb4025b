/* device_coll_group.h without CUDA: never on. */
#include "device_coll_group.h"
#include "status.h"

void braid__devcoll_prepare(braid_pg *pg)
{
    (void)pg;
}

braid_status braid__devcoll_exchange(braid_pg *pg)
{
    (void)pg;
    return BRAID_OK;
}

void braid__devcoll_flush(braid_pg *pg)
{
    (void)pg;
}

void braid__devcoll_detach(braid_pg *pg)
{
    (void)pg;
}

braid_status braid__devcoll_agree(braid_pg *pg, int device)
{
    (void)pg;
    (void)device;
    return BRAID_OK;
}

int braid__devcoll_takes(braid_pg *pg, const braid_coll *coll, int device)
{
    (void)pg;
    (void)coll;
    (void)device;
    return 0;
}

braid_status braid__devcoll_run(braid_pg *pg, const braid_coll *coll, void *stream, braid_work **work)
{
    (void)coll;
    (void)stream;
    (void)work;
    return braid__error(BRAID_ERR_INTERNAL, "rank %d: device collective without CUDA", pg->rank);
}

int braid__devcoll_fault(braid_pg *pg, char *text, size_t cap)
{
    (void)pg;
    (void)text;
    (void)cap;
    return 0;
}

void braid__devcoll_abort(braid_pg *pg)
{
    (void)pg;
}

void braid__devcoll_release(braid_pg *pg)
{
    (void)pg;
}
