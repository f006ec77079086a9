/* The driver's stream-ordered pool as a PyTorch pluggable allocator, and
 * nothing else: beside PyTorch's own cudaMallocAsync backend it shows what
 * the pluggable path (CUDAPluggableAllocator, which memres is plugged in
 * by) costs by itself. train_check.py --also shim-async uses it.
 *
 *     gcc -O2 -shared -fPIC async_shim.c -o async_shim.so \
 *         -I$CUDA_HOME/include -L$CUDA_HOME/lib64 -lcudart
 */
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <cuda_runtime_api.h>

/* As PyTorch's own backend does: the pool keeps what it has mapped across
 * synchronizations (by default it gives it all back at each one). Setting
 * it twice, if two threads race here, does no harm. */
static atomic_int pool_keeps;

static void keep_pool(int device) {
    cudaMemPool_t pool;
    uint64_t all = UINT64_MAX;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess)
        (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &all);
    pool_keeps = 1;
}

/* PyTorch raises its out-of-memory error on NULL. */
void *shim_alloc(ssize_t size, int device, cudaStream_t stream) {
    void *ptr = NULL;
    if (!pool_keeps)
        keep_pool(device); /* PyTorch makes `device` current before it calls. */
    if (cudaMallocAsync(&ptr, (size_t)size, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return ptr;
}

void shim_free(void *ptr, ssize_t size, int device, cudaStream_t stream) {
    (void)size;
    (void)device;
    (void)cudaFreeAsync(ptr, stream);
}
