/* dlsym(RTLD_NEXT, "pthread_create") from a library: jemalloc finds
 * pthread_create that way for the background thread that purges its arenas
 * (redis turns it on), and so started a thread llft never saw, whose lock
 * acquisitions raced the replayed ones: a backup's heap drifted from the
 * primary's, and a later malloc took other locks there.  Replicating the
 * thread is not enough (it reads page counts without a lock to decide how
 * long to sleep), so such a lookup gets a function that refuses to start
 * it: jemalloc then purges in the threads that allocate, which are
 * replicated.
 *
 * Every other lookup goes on to the real dlsym by a tail jump: RTLD_NEXT is
 * relative to the caller, which the real dlsym finds by its return address,
 * so that address must still be the caller's. */
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym;

static dlsym_fn find_real_dlsym(void)
{
    dlsym_fn p = __atomic_load_n(&real_dlsym, __ATOMIC_RELAXED);
    if (UNLIKELY(!p)) {
        p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!p)
            p = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        if (!p) {
            llft_log("llft: cannot find the real dlsym: %s", dlerror());
            llft_exit_now(LLFT_EXIT_NOSTREAM);
        }
        __atomic_store_n(&real_dlsym, p, __ATOMIC_RELAXED);
    }
    return p;
}

/* The shim resolves the real functions itself through dlsym(RTLD_NEXT). */
static int from_shim(const void *caller)
{
    Dl_info mine, theirs;
    return dladdr((const void *)&find_real_dlsym, &mine) && dladdr(caller, &theirs) &&
           mine.dli_fbase == theirs.dli_fbase;
}

/* What such a lookup gets: threads it would start are refused. */
static int refuse_thread(pthread_t *th, const pthread_attr_t *attr, void *(*fn)(void *), void *arg)
{
    return EAGAIN;
}

EXPORT void *dlsym(void *restrict handle, const char *restrict name)
{
    if (UNLIKELY(handle == RTLD_NEXT && strcmp(name, "pthread_create") == 0) &&
        !from_shim(__builtin_return_address(0)))
        return (void *)&refuse_thread;
    return find_real_dlsym()(handle, name); /* a tail jump: see above */
}
