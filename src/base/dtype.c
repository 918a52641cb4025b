/* dtype traits: one row per braid_dtype, its element size and its name in
 * messages. A new dtype adds its row here, its enum value in braid.h and
 * its kernels (src/reduce/, cuda/reduce_kernels.cu). */
#include "braid.h"
#include "status.h"

typedef struct {
    size_t size;
    const char *name;
} dtype_row;

static const dtype_row rows[BRAID_DTYPE_COUNT] = {
    [BRAID_F32] = {4, "f32"}, [BRAID_F64] = {8, "f64"}, [BRAID_F16] = {2, "f16"}, [BRAID_BF16] = {2, "bf16"},
    [BRAID_I8] = {1, "i8"},   [BRAID_U8] = {1, "u8"},   [BRAID_I32] = {4, "i32"}, [BRAID_I64] = {8, "i64"},
    [BRAID_U32] = {4, "u32"}, [BRAID_U64] = {8, "u64"},
};

BRAID_API size_t braid_dtype_size(braid_dtype dtype)
{
    return (unsigned)dtype < BRAID_DTYPE_COUNT ? rows[dtype].size : 0;
}

const char *braid__dtype_name(braid_dtype dtype)
{
    return (unsigned)dtype < BRAID_DTYPE_COUNT && rows[dtype].name ? rows[dtype].name : "invalid";
}
