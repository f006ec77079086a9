/* Loaded with LD_PRELOAD by hang_loop.sh (mode `late`): every thread made
 * with pthread_create sleeps LATE_EXIT_MS (default 2000) after its start
 * routine returns, before it exits. A test thread then exits only once
 * the other tests are out of the driver, so a hang that remains is not
 * caused by a thread's exit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

struct start {
    void *(*fn)(void *);
    void *arg;
};

static void *trampoline(void *p) {
    struct start s = *(struct start *)p;
    free(p);
    void *result = s.fn(s.arg);
    const char *ms = getenv("LATE_EXIT_MS");
    long n = ms ? atol(ms) : 2000;
    struct timespec t = {n / 1000, (n % 1000) * 1000000L};
    nanosleep(&t, NULL);
    return result;
}

int pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *), void *arg) {
    static int (*real)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    if (!real) real = (int (*)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *))dlsym(RTLD_NEXT, "pthread_create");
    struct start *p = malloc(sizeof *p);
    if (!p) return real(t, attr, fn, arg);
    p->fn = fn;
    p->arg = arg;
    return real(t, attr, trampoline, p);
}
