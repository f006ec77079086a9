/*
 * memres: a GPU memory manager, as a C library (libmemres.so).
 *
 * memres_alloc and memres_free have the signatures that PyTorch's
 * torch.cuda.memory.CUDAPluggableAllocator loads:
 *
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *       "libmemres.so", "memres_alloc", "memres_free")
 *   torch.cuda.memory.change_current_allocator(alloc)
 *
 * Each device gets its own resource, built the first time the device is
 * used, from the stack set by memres_configure, else the environment
 * variable MEMRES_STACK, else
 * "stats(pool(cuda, per_stream=true, growth=32, granule=2MiB))". A stack
 * is written as nested calls, outermost first, for example
 *
 *   stats(pool(async, per_stream=true, initial=1GiB))
 *   log(pool(async), file=/tmp/trace.csv)
 *
 * Leaves: async (stream-ordered, on a driver pool of its own; initial=,
 * release_threshold=, ipc=none|posix_fd|fabric; pool=default|managed
 * serves from the device's default pool, or its default pool of managed
 * memory, as they are), cuda (cuMemAlloc), managed (cuMemAllocManaged),
 * vmm (a pool over reserved address ranges that maps memory where live
 * blocks are, through cuMemCreate/cuMemMap: one range of reserve= bytes
 * (rounded up to the device's granule), and when it is full another as
 * large, up to 4; reserve=,
 * release_threshold=, handle_granules=, large_handles=, slack=,
 * trim_on_commit=, per_stream=true|false (a pool per stream, with
 * reservations of its own; false); it unmaps only after synchronizing the
 * stream of the call). Adaptors and
 * algorithms: pool (initial=, max=, growth=double|default|N, granule=
 * (32MiB: chunks are multiples of it), release=true|false|peak (give
 * wholly free chunks back before growing; true; peak: only past the peak
 * in use), large=SIZE|none (requests of at least SIZE get chunks of their
 * own; none), per_stream=true|false (a pool per stream; false)), fixed
 * (blocks of one size), binning (size bins: bin(SIZE), bin(SIZE, RESOURCE),
 * min_bin=, max_bin=, powers=), arena (per-thread arenas over a global
 * one), planned (lays out each step from the one before: see memres_step),
 * stats, track, limit, align, log, prefetch (prefetches managed memory to
 * the device). memres_core::stack's documentation gives every key. sim,
 * host, vpool and pinned (simulated or host memory) are refused.
 * A file= is one device's: a second device whose stack names a file that
 * a live log writes fails its first call with a message naming the file
 * (MEMRES_LOG_FILE names one file per device).
 *
 * When the environment variable MEMRES_LOG_FILE (RMM's RMM_LOG_FILE) names
 * a file, each device's stack logs every call in RMM's CSV format to that
 * name with ".dev<N>" before its extension (trace.csv: trace.dev0.csv).
 * memres_configure checks the name (-1 when its directory is missing, it
 * is a directory or ends with "/", "." or "..", has white space around it,
 * or this process cannot write it or its directory); without
 * memres_configure, a device's first call checks it before its stack is
 * built. A file that cannot be made is the error of the device's first
 * call.
 *
 * Streams. With per_stream=true (the default stack) the pool is
 * stream-ordered, as PyTorch's own allocator is: a block freed on a stream
 * is reused on that stream at once, and by another stream only once that
 * stream is ordered after the free (memory moves between streams as whole
 * chunks, after a wait on an event recorded after their frees; on out of
 * memory the device is synchronized). A block freed on another stream than
 * its allocation's is reused by the allocating stream only after it waits
 * on the freeing one. vmm(per_stream=true) is stream-ordered the same way,
 * and a stack whose allocations reach an async leaf directly (stats(async))
 * is ordered by the driver. Every other stack (a pool or vmm without
 * per_stream, cuda, managed) hands a freed block to the next request
 * whatever its stream: correct only when the program frees a block once
 * every stream that used it is done with it. Under planned, a block of a
 * step's region freed on another stream than the step's waits for that
 * stream inside memres_free (a host synchronization: work on that stream
 * must not wait for the freeing thread). The stream of a call is a stream of its device: NULL,
 * cudaStreamLegacy and cudaStreamPerThread name that device's default
 * streams in its primary context, whatever context the calling thread has
 * current (none, or another device's); any other handle must be a stream
 * of the device's primary context (as the CUDA runtime's, PyTorch's and
 * CuPy's streams are), valid for the call. Streams are used only during
 * the call that names them and may be destroyed at any time; a destroyed stream's handle reused by a new
 * stream is taken for the same stream, so synchronize a stream before
 * destroying it if its handle may come back.
 *
 * No function aborts or lets an exception through; failures are return
 * values, with a message for memres_last_error. A stream handle that is
 * not a live stream (a made-up value, a destroyed stream's) is undefined
 * behaviour, as it is for the CUDA runtime: it may crash the process in
 * this call or a later one.
 */
#ifndef MEMRES_H
#define MEMRES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* The figures of a device's stack (all bytes unless named counts). */
typedef struct memres_stats_t {
    int64_t bytes_current;    /* live now, per the outermost stats adaptor (0 without one) */
    int64_t bytes_peak;       /* most live at once, per stats */
    int64_t bytes_total;      /* ever allocated, per stats */
    int64_t count_current;    /* live allocations, per stats */
    int64_t count_peak;       /* most live allocations at once, per stats */
    int64_t count_total;      /* allocations ever made, per stats */
    int64_t upstream_current; /* held from the device by the CUDA leaves now (vmm: mapped) */
    int64_t upstream_peak;    /* most held from the device at once */
    int64_t upstream_total;   /* ever taken from the device */
    int64_t reserved_current; /* reserved by the driver pools of async leaves now, each pool once */
    int64_t reserved_peak;    /* the sum of each of those pools' most reserved */
    int64_t live_blocks;      /* blocks from memres_alloc not yet freed */
    int64_t has_stats;        /* 1 when the stack has a stats adaptor, else 0 */
} memres_stats_t;

/* What the planned(...) layers of a device's stack have done, summed over
 * them: whether a training loop is being laid out. */
typedef struct memres_steps_t {
    int64_t steps;               /* calls of memres_step */
    int64_t followed;            /* steps served from a plan from start to end */
    int64_t plans;               /* plans made, each from a step that repeated the last */
    int64_t planned_allocations; /* allocations served from the plans' regions */
    int64_t region;              /* bytes of the steps' regions held now */
    int64_t carry_region;        /* bytes of the regions of carried blocks held now */
} memres_steps_t;

/* Allocates size bytes on device (negative: the current device), ordered
 * on stream (NULL: the legacy default stream). Returns NULL when size is 0,
 * and NULL with a message when the memory cannot be had, the device's
 * stack cannot be built, or the stack handed out a block at an address
 * that is live, at 0, or of another size than asked (the block goes back to
 * it; one the stack refuses back is kept, the message says so, and
 * memres_release gives it back). stream (a cudaStream_t) is a stream of
 * device (see Streams above). */
void *memres_alloc(ssize_t size, int device, void *stream);

/* Frees ptr, allocated by memres_alloc with size bytes on device, ordered
 * on stream: work queued on stream before the free may still use it, work
 * on other streams that uses it must be ordered before the free. NULL is
 * ignored. A pointer not allocated here, or a size that differs from the
 * allocation's (a negative size skips that check), is refused with a
 * message. It returns nothing (PyTorch's signature): it clears the calling
 * thread's message first, so a message after it says that it failed. */
void memres_free(void *ptr, ssize_t size, int device, void *stream);

/* Sets the stack of every device used from now on. Returns 0, or -1 with a
 * message: a bad stack (the message names the byte position), NULL, or a
 * device in use already. */
int memres_configure(const char *stack);

/* Fills *out with the figures of device's stack. Returns 0, or -1 with a
 * message (the device has not been used yet, out is NULL or not aligned
 * for a memres_stats_t). */
int memres_stats(int device, memres_stats_t *out);

/* Copies the calling thread's latest error message into buf (at most
 * len - 1 bytes and a NUL) and returns its full length: 0 when this thread
 * had none (or none since its last memres_free or memres_empty_cache).
 * Kept per thread, as cudaGetLastError's.
 * buf may be NULL to ask for the length. */
size_t memres_last_error(char *buf, size_t len);

/* Copies the stack device runs (or, not used yet, the one its first use
 * would build now, unchecked: a malformed one is refused then) into buf
 * as memres_last_error does; returns its length, or 0 with a message (the
 * device is out of range, MEMRES_STACK is not UTF-8). */
size_t memres_stack(int device, char *buf, size_t len);

/* Marks the start of a step (one iteration of a training loop) on device
 * (negative: the current device), ordered on stream (NULL: the legacy
 * default stream): each planned(...) layer of the device's stack lays the
 * coming step out from the one that ended. Returns how many planned layers
 * it stepped (0 for a stack with none), or -1 with a message. Every layer
 * is stepped, those after one that fails too, so that the layers stay in
 * step with each other; the message is the first layer's error, with how
 * many failed where more than one did. */
int memres_step(int device, void *stream);

/* Fills *out with what the planned layers of device's stack have done
 * (zeros for a stack without one). Returns how many planned layers there
 * are, or -1 with a message (the device has not been used yet, out is
 * NULL or not aligned for a memres_steps_t). */
int memres_steps(int device, memres_steps_t *out);

/* Gives back to device (negative: the current device) what the pools of
 * its stack keep free, once every stream of the device is done, ordered on
 * stream (NULL: the device's legacy default stream): the wholly free
 * chunks of each pool, fixed, binning and arena layer, a vmm leaf's mapped
 * granules that no block uses, an async
 * leaf's driver pool reserve beyond what is in use, the regions of a
 * planned layer that no block lives in, once its step's region is free
 * (its plan goes, and the next steps are laid out afresh; gradients kept
 * between steps keep the carry region). Returns the bytes given
 * back to the device, each counted once (a pool's chunk that vmm then
 * unmaps counts when it is unmapped; 0 for a device not used yet), or -1
 * with a message. First it gives back the blocks kept by memres_alloc
 * (above); one still refused stays kept, and makes the call -1 with a
 * message saying so, once the pools have given back. */
int64_t memres_release(int device, void *stream);

/* memres_release of every device used so far, on its legacy default
 * stream; the first failure is kept for memres_last_error, and the other
 * devices still give back. It returns nothing: it clears the calling
 * thread's message, so a message after it is a device's failure. Its
 * signature is that of the reset function of
 * PyTorch's CUDAPluggableAllocator, which torch.cuda.empty_cache() calls:
 * allocator.allocator().set_reset_fn(address of memres_empty_cache). */
void memres_empty_cache(void);

/* Writes out what the log adaptors of every device hold in their buffers
 * (also done when the process exits). Returns 0, or -1 with a message when
 * a write failed. */
int memres_flush(void);

/* Writes a snapshot of every device used so far to the file path, in the
 * format of PyTorch's torch.cuda.memory._snapshot() (a pickle that
 * PyTorch's memory viewer opens). Needs MEMRES_SNAPSHOT=1 in the
 * environment before a device is first used. A file is written whole:
 * into a temporary file beside it, then renamed over it, so that a reader
 * never sees part of one; a device or a pipe (/dev/null, a named pipe) is
 * written into as it comes (a reader gone midway gets part of it, and a
 * named pipe waits for its reader). Returns 0, or -1 with a message (a
 * file at path is then as it was). */
int memres_snapshot(const char *path);

#ifdef __cplusplus
}
#endif

#endif /* MEMRES_H */
