/* A small fork-join thread pool owned by the context.  Work functions have
 * the shape fn(arg, ith, nth) so an engine with its own pool can drive the
 * same kernels.  The caller runs as thread 0. */
#include "core/internal.h"

#include <pthread.h>
#include <stdlib.h>

struct msa_threadpool {
    int size;
    pthread_t *threads;
    pthread_mutex_t lock;
    pthread_cond_t start_cv;
    pthread_cond_t done_cv;
    msa_work_fn fn;
    void *arg;
    unsigned long generation; /* bumped for every job */
    int pending;              /* workers still running the current job */
    int quit;
};

typedef struct worker_arg {
    msa_threadpool *pool;
    int ith;
} worker_arg;

static void *worker_main(void *p)
{
    worker_arg wa = *(worker_arg *)p;
    free(p);
    msa_threadpool *pool = wa.pool;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->quit && pool->generation == seen)
            pthread_cond_wait(&pool->start_cv, &pool->lock);
        if (pool->quit)
            break;
        seen = pool->generation;
        msa_work_fn fn = pool->fn;
        void *arg = pool->arg;
        pthread_mutex_unlock(&pool->lock);
        fn(arg, wa.ith, pool->size);
        pthread_mutex_lock(&pool->lock);
        if (--pool->pending == 0)
            pthread_cond_signal(&pool->done_cv);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

msa_status msa_threadpool_create(int num_threads, msa_threadpool **out)
{
    *out = NULL;
    msa_threadpool *pool = calloc(1, sizeof *pool);
    if (!pool)
        return MSA_ERR_OUT_OF_MEMORY;
    pool->size = num_threads < 1 ? 1 : num_threads;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->start_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    if (pool->size > 1) {
        pool->threads = calloc((size_t)pool->size, sizeof *pool->threads);
        if (!pool->threads) {
            msa_threadpool_free(pool);
            return MSA_ERR_OUT_OF_MEMORY;
        }
    }
    for (int i = 1; i < pool->size; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) {
            wa->pool = pool;
            wa->ith = i;
        }
        if (!wa || pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->size = i; /* only threads 1..i-1 exist */
            msa_threadpool_free(pool);
            return MSA_ERR_OUT_OF_MEMORY;
        }
    }
    *out = pool;
    return MSA_OK;
}

void msa_threadpool_free(msa_threadpool *pool)
{
    if (!pool)
        return;
    pthread_mutex_lock(&pool->lock);
    pool->quit = 1;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 1; i < pool->size; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->lock);
    pthread_cond_destroy(&pool->start_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool->threads);
    free(pool);
}

void msa_threadpool_run(msa_threadpool *pool, msa_work_fn fn, void *arg)
{
    if (pool->size == 1) {
        fn(arg, 0, 1);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->pending = pool->size - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->lock);
    fn(arg, 0, pool->size);
    pthread_mutex_lock(&pool->lock);
    while (pool->pending > 0)
        pthread_cond_wait(&pool->done_cv, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}

int msa_threadpool_size(const msa_threadpool *pool) { return pool ? pool->size : 1; }
