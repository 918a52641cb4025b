/* dtype traits: the size of one element of each braid_dtype. */
#include "braid.h"

BRAID_API size_t braid_dtype_size(braid_dtype dtype)
{
    static const size_t sizes[BRAID_DTYPE_COUNT] = {
        [BRAID_F32] = 4, [BRAID_F64] = 8, [BRAID_F16] = 2, [BRAID_BF16] = 2,
        [BRAID_I8] = 1,  [BRAID_U8] = 1,  [BRAID_I32] = 4, [BRAID_I64] = 8,
        [BRAID_U32] = 4, [BRAID_U64] = 8,
    };
    return (unsigned)dtype < BRAID_DTYPE_COUNT ? sizes[dtype] : 0;
}
