// The calls of four tests of `backends/cuda/tests/resources.rs`, made with
// the CUDA driver API alone (no memres, no Rust, no test harness), one
// thread per test, started together:
//
//   A  async_memory_round_trip_and_pool_attributes: a pool of its own with a
//      release threshold, round trips on a stream, its attributes read,
//      trimmed to 0 and destroyed
//   P  default_pool_view_leaves_the_pool_alive: round trips from the
//      device's default pool
//   L  async_memory_on_the_legacy_stream: a pool of its own used on the
//      legacy stream, destroyed
//   T  any_thread_without_setup_gets_the_primary_context_bound: a pool of
//      its own used from a thread that the test thread starts, destroyed
//
// A round trip allocates blocks of odd sizes and aligned ones, fills them
// (cuMemsetD32Async), reads them back into pageable host memory
// (cuMemcpyDtoHAsync, cuStreamSynchronize), checks them and frees them.
// The pools reserve nothing at creation (the tests' pools reserve half the
// free memory; a build of the tests that reserves nothing hangs as often).
//
// A process that does not end within seconds has hung: docs/verification.md.
//
//   cc -O1 -pthread -o hang_pools hang_pools.c -I$CUDA_HOME/include -lcuda
//   ./hang_pools [tests, default APLT]
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                   \
  do {                                                                          \
    CUresult r_ = (x);                                                          \
    if (r_) {                                                                   \
      fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #x, (int)r_);     \
      exit(3);                                                                  \
    }                                                                           \
  } while (0)

static CUdevice dev;
static CUcontext ctx;
static pthread_barrier_t start;
static const size_t SIZES[5] = {4, 1000, 4096, 1 << 20, (2 << 20) + 4};

// Binds the primary context to the calling thread, as memres does for a call.
static void bind(void) {
  CUcontext c;
  CK(cuCtxGetCurrent(&c));
  if (c != ctx) CK(cuCtxSetCurrent(ctx));
}

static void fill(CUstream s, CUdeviceptr p, unsigned v, size_t size) {
  CK(cuMemsetD32Async(p, v, size / 4, s));
}

static void expect(CUstream s, CUdeviceptr p, unsigned v, size_t size) {
  size_t n = size / 4 * 4;
  unsigned *h = malloc(n ? n : 1);
  CK(cuMemcpyDtoHAsync(h, p, n, s));
  CK(cuStreamSynchronize(s));
  for (size_t k = 0; k < n / 4; k++)
    if (h[k] != v) {
      fprintf(stderr, "word %zu: %#x, not %#x\n", k, h[k], v);
      exit(4);
    }
  free(h);
}

// An allocation padded for `align`, as memres asks the driver for one.
static CUdeviceptr alloc(CUmemoryPool pool, size_t size, size_t align, CUstream s) {
  size_t bytes = size + (align > 256 ? align - 256 : 0), free_, total;
  CUdeviceptr p;
  CK(cuMemGetInfo(&free_, &total));
  CK(cuMemAllocFromPoolAsync(&p, bytes, pool, s));
  return p;
}

static void round_trip(CUmemoryPool pool, CUstream s) {
  CUdeviceptr b[5];
  for (int i = 0; i < 5; i++) b[i] = alloc(pool, SIZES[i], 256, s);
  for (int i = 0; i < 5; i++) fill(s, b[i], 0x1000 + i, SIZES[i]);
  for (int i = 0; i < 5; i++) expect(s, b[i], 0x1000 + i, SIZES[i]);
  size_t aligns[3] = {4096, 1 << 16, 1 << 21};
  for (int i = 0; i < 3; i++) {
    CUdeviceptr p = alloc(pool, 3000, aligns[i], s);
    CUdeviceptr a = (p + aligns[i] - 1) & ~(CUdeviceptr)(aligns[i] - 1);
    unsigned v = 0xA11C0000u | (unsigned)(aligns[i] >> 8);
    fill(s, a, v, 3000);
    expect(s, a, v, 3000);
    CK(cuMemFreeAsync(p, s));
  }
  for (int i = 0; i < 5; i++) CK(cuMemFreeAsync(b[i], s));
  CK(cuStreamSynchronize(s));
}

static CUmemoryPool make_pool(size_t initial, cuuint64_t threshold) {
  int supported;
  CK(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, dev));
  CUmemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool pool;
  CK(cuMemPoolCreate(&pool, &props));
  size_t free_, total;
  CK(cuMemGetInfo(&free_, &total));
  cuuint64_t t = threshold ? threshold : total;
  CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &t));
  if (initial) {
    CUdeviceptr p;
    CK(cuMemAllocFromPoolAsync(&p, initial, pool, CU_STREAM_LEGACY));
    CK(cuMemFreeAsync(p, CU_STREAM_LEGACY));
  }
  return pool;
}

static CUstream make_stream(void) {
  CUstream s;
  CK(cuStreamCreateWithPriority(&s, CU_STREAM_DEFAULT, 0));
  return s;
}

static void *test_a(void *unused) {
  (void)unused;
  pthread_barrier_wait(&start);
  bind();
  CUmemoryPool pool = make_pool(16 << 20, 64 << 20);
  cuuint64_t v;
  CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v));
  CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &v));
  CUstream s = make_stream();
  round_trip(pool, s);
  CUdeviceptr p = alloc(pool, 8 << 20, 256, s);
  CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  CK(cuMemFreeAsync(p, s));
  CK(cuStreamSynchronize(s));
  CK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &v));
  if (v) {
    fprintf(stderr, "%llu bytes still used\n", (unsigned long long)v);
    exit(5);
  }
  CK(cuMemPoolTrimTo(pool, 0));
  CK(cuStreamDestroy(s));
  CK(cuMemPoolDestroy(pool));
  return 0;
}

static void *test_p(void *unused) {
  (void)unused;
  pthread_barrier_wait(&start);
  bind();
  CUstream s = make_stream();
  CUmemoryPool pool;
  CK(cuDeviceGetDefaultMemPool(&pool, dev));
  round_trip(pool, s);
  CK(cuDeviceGetDefaultMemPool(&pool, dev));
  round_trip(pool, s);
  CK(cuStreamDestroy(s));
  return 0;
}

static void *test_l(void *unused) {
  (void)unused;
  pthread_barrier_wait(&start);
  bind();
  CUmemoryPool pool = make_pool(0, 0);
  CUdeviceptr p = alloc(pool, 1 << 20, 256, CU_STREAM_LEGACY);
  fill(CU_STREAM_LEGACY, p, 0x1E6AC700, 1 << 20);
  expect(CU_STREAM_LEGACY, p, 0x1E6AC700, 1 << 20);
  CK(cuMemFreeAsync(p, CU_STREAM_LEGACY));
  CK(cuMemPoolDestroy(pool));
  return 0;
}

static CUmemoryPool t_pool;
static CUstream t_stream;

static void *test_t_inner(void *unused) {
  (void)unused;
  bind();
  CUdeviceptr p = alloc(t_pool, 1 << 16, 256, t_stream);
  fill(t_stream, p, 7, 1 << 16);
  expect(t_stream, p, 7, 1 << 16);
  CK(cuMemFreeAsync(p, t_stream));
  p = alloc(t_pool, 256, 256, CU_STREAM_LEGACY);
  CK(cuMemFreeAsync(p, CU_STREAM_LEGACY));
  CUcontext c;
  CK(cuCtxGetCurrent(&c));
  return 0;
}

static void *test_t(void *unused) {
  (void)unused;
  pthread_barrier_wait(&start);
  bind();
  t_pool = make_pool(0, 0);
  t_stream = make_stream();
  pthread_t inner;
  pthread_create(&inner, 0, test_t_inner, 0);
  pthread_join(inner, 0);
  CK(cuStreamDestroy(t_stream));
  CK(cuMemPoolDestroy(t_pool));
  return 0;
}

int main(int argc, char **argv) {
  const char *tests = argc > 1 ? argv[1] : "APLT";
  int n = (int)strlen(tests);
  if (n < 1 || n > 8 || strspn(tests, "APLT") != (size_t)n || strchr(tests, 'T') != strrchr(tests, 'T')) {
    fprintf(stderr, "usage: %s [up to eight of A P L T, T at most once]\n", argv[0]);
    return 2;
  }
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  pthread_t threads[8];
  pthread_barrier_init(&start, 0, (unsigned)n);
  for (int i = 0; i < n; i++) {
    void *(*f)(void *) = tests[i] == 'A' ? test_a : tests[i] == 'P' ? test_p : tests[i] == 'L' ? test_l : test_t;
    pthread_create(&threads[i], 0, f, 0);
  }
  for (int i = 0; i < n; i++) pthread_join(threads[i], 0);
  return 0;
}
