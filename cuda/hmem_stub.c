/* src/calls/hmem.h without CUDA: no pointer is device memory, so every call takes
 * the CPU path, and a CUDA stream is refused as before. */
#include "pg_algo.h"
#include "hmem.h"
#include "status.h"

braid_mem braid__mem_of(const void *p)
{
    (void)p;
    return (braid_mem){0, 0};
}

braid_status braid__hmem_submit(braid_pg *pg, const braid_coll *coll, void *cuda_stream, braid_work **work)
{
    if (cuda_stream)
        return braid__error(BRAID_ERR_UNSUPPORTED, "rank %d: %s: CUDA streams need a CUDA build", pg->rank,
                            braid__coll_job_name(coll));
    return braid__work_submit(pg, coll, work);
}

braid_status braid__hmem_coll_run(braid_pg *pg, braid_coll *coll)
{
    (void)coll;
    return braid__error(BRAID_ERR_INTERNAL, "rank %d: cuda staging job in a build without CUDA", pg->rank);
}

void braid__hmem_coll_done(braid_coll *coll)
{
    (void)coll;
}

void braid__hmem_coll_release(braid_coll *coll)
{
    coll->hmem = NULL;
}

void braid__hmem_pg_prepare(braid_pg *pg)
{
    (void)pg;
}

void braid__hmem_pg_release(braid_pg *pg)
{
    (void)pg;
}
