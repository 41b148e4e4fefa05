/* fabric.sh --mpi-net: keeps MPICH 4.0.2's UCX answering during MPI_Finalize. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <ucp/api/ucp.h>

#define MAX_WORKERS 16
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t thread;
static volatile int closing, stop;
static int started, nworkers;
static ucp_worker_h workers[MAX_WORKERS];

/* MailRail loads libmpich (and so libucp) with dlopen, out of RTLD_NEXT's reach. */
static void *real_symbol(const char *name)
{
    void *f = dlsym(RTLD_NEXT, name), *ucp;
    if (f == NULL && (ucp = dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD)) != NULL)
        f = dlsym(ucp, name);
    return f;
}
#define REAL(f) static __typeof__(f) *real_##f; \
    if (!real_##f) real_##f = (__typeof__(f) *)real_symbol(#f)
#define LOCKED(call) do { pthread_mutex_lock(&lock); call; pthread_mutex_unlock(&lock); } while (0)

static void *progress(void *arg)
{
    struct timespec pause = { 0, 100000 };
    (void)arg;
    REAL(ucp_worker_progress);
    while (!stop) {
        pthread_mutex_lock(&lock);
        for (int i = 0; i < nworkers && !stop; i++) real_ucp_worker_progress(workers[i]);
        pthread_mutex_unlock(&lock);
        nanosleep(&pause, NULL);
    }
    return NULL;
}

ucs_status_ptr_t ucp_disconnect_nb(ucp_ep_h ep)
{
    ucs_status_ptr_t r;
    REAL(ucp_disconnect_nb);
    closing = 1;
    LOCKED(r = real_ucp_disconnect_nb(ep));
    return r;
}

unsigned ucp_worker_progress(ucp_worker_h worker)
{
    unsigned n;
    int i;
    REAL(ucp_worker_progress);
    if (!closing) return real_ucp_worker_progress(worker);
    pthread_mutex_lock(&lock);
    for (i = 0; i < nworkers && workers[i] != worker; i++) ;
    if (i == nworkers && nworkers < MAX_WORKERS && !stop) workers[nworkers++] = worker;
    n = real_ucp_worker_progress(worker);
    pthread_mutex_unlock(&lock);
    if (!started && !stop) started = pthread_create(&thread, NULL, progress, NULL) == 0;
    if (n == 0) {
        struct timespec idle = { 0, 100000 };
        nanosleep(&idle, NULL);
    }
    return n;
}

ucs_status_t ucp_request_check_status(void *request)
{
    ucs_status_t s;
    REAL(ucp_request_check_status);
    if (!closing) return real_ucp_request_check_status(request);
    LOCKED(s = real_ucp_request_check_status(request));
    return s;
}

int ucp_request_is_completed(void *request)
{
    int c;
    REAL(ucp_request_is_completed);
    if (!closing) return real_ucp_request_is_completed(request);
    LOCKED(c = real_ucp_request_is_completed(request));
    return c;
}

void ucp_request_release(void *request)
{
    REAL(ucp_request_release);
    if (!closing) { real_ucp_request_release(request); return; }
    LOCKED(real_ucp_request_release(request));
}

void ucp_request_free(void *request)
{
    REAL(ucp_request_free);
    if (!closing) { real_ucp_request_free(request); return; }
    LOCKED(real_ucp_request_free(request));
}

void ucp_worker_release_address(ucp_worker_h worker, ucp_address_t *address)
{
    REAL(ucp_worker_release_address);
    if (!closing) { real_ucp_worker_release_address(worker, address); return; }
    LOCKED(real_ucp_worker_release_address(worker, address));
}

void ucp_worker_destroy(ucp_worker_h worker)
{
    REAL(ucp_worker_destroy);
    if (closing && !stop) {
        stop = 1;
        if (started) pthread_join(thread, NULL);
    }
    real_ucp_worker_destroy(worker);
}
