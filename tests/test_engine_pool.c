/*
 * The CPU backend on an engine's threads (msa_context_params.parallel_for):
 * the quick sweep's cases (of the small shapes by default) run on a context whose work goes through a
 * callback pool, against the oracle, and each case's outputs must equal bit
 * for bit those of a context on the library's own threads with the same
 * thread count.  Two engine pools: a serial one that runs the tasks in
 * reverse order on the calling thread, and one that runs every task on a
 * thread of its own.
 *   test_engine_pool [--filter TEXT]   (default: the small shapes, "small/")
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "testkit.h"

#define THREADS 3

/* What an engine pool saw: calls, tasks and tasks out of range. */
typedef struct engine_stats {
    atomic_long calls, tasks, bad;
} engine_stats;

static void serial_for(void *engine, int n, void (*task)(void *arg, int i), void *arg)
{
    engine_stats *st = engine;
    atomic_fetch_add(&st->calls, 1);
    if (n != THREADS)
        atomic_fetch_add(&st->bad, 1);
    for (int i = n - 1; i >= 0; i--) {
        task(arg, i);
        atomic_fetch_add(&st->tasks, 1);
    }
}

typedef struct thread_task {
    void (*task)(void *arg, int i);
    void *arg;
    int i;
    engine_stats *st;
} thread_task;

static void *thread_main(void *p)
{
    thread_task *t = p;
    t->task(t->arg, t->i);
    atomic_fetch_add(&t->st->tasks, 1);
    return NULL;
}

/* Every task on a thread of its own, the last on the caller's. */
static void threads_for(void *engine, int n, void (*task)(void *arg, int i), void *arg)
{
    engine_stats *st = engine;
    atomic_fetch_add(&st->calls, 1);
    if (n != THREADS) {
        atomic_fetch_add(&st->bad, 1);
        return;
    }
    pthread_t th[THREADS];
    thread_task tt[THREADS];
    int started[THREADS] = {0};
    for (int i = 0; i < n; i++)
        tt[i] = (thread_task){task, arg, i, st};
    for (int i = 0; i < n - 1; i++)
        started[i] = pthread_create(&th[i], NULL, thread_main, &tt[i]) == 0;
    thread_main(&tt[n - 1]);
    for (int i = 0; i < n - 1; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            thread_main(&tt[i]); /* no thread: the caller runs it */
    }
}

static void run_sweep(const char *what, void (*pf)(void *, int, void (*)(void *, int), void *),
                      const char *filter)
{
    engine_stats st;
    atomic_init(&st.calls, 0);
    atomic_init(&st.tasks, 0);
    atomic_init(&st.bad, 0);
    msa_sweep_options opts;
    memset(&opts, 0, sizeof opts);
    opts.backend = MSA_BACKEND_CPU;
    opts.quick = 1;
    opts.filter = filter;
    opts.log = stdout;
    opts.num_threads = THREADS;
    opts.parallel_for = pf;
    opts.engine = &st;
    opts.compare_own_pool = 1;
    int passed = 0, failed = 0, skipped = 0;
    printf("== %s engine pool\n", what);
    msa_sweep_run(&opts, &passed, &failed, &skipped);
    CHECK(failed == 0 && passed > 0, "%s pool: %d passed, %d failed", what, passed, failed);
    printf("%s pool: %d passed, %d failed, %d skipped (cases this version does not run)\n", what,
           passed, failed, skipped);
    long calls = atomic_load(&st.calls), tasks = atomic_load(&st.tasks);
    CHECK(calls > 0 && tasks == calls * THREADS, "%s pool: %ld calls ran %ld tasks", what, calls,
          tasks);
    CHECK(atomic_load(&st.bad) == 0, "%s pool: %ld calls with a task count other than %d", what,
          (long)atomic_load(&st.bad), THREADS);
}

/* A context on an engine pool reports the engine's thread count and
 * creates, frees and runs nothing before a forward. */
static void test_context(void)
{
    engine_stats st;
    atomic_init(&st.calls, 0);
    atomic_init(&st.tasks, 0);
    atomic_init(&st.bad, 0);
    msa_context_params p;
    msa_context_params_default(&p);
    CHECK(p.parallel_for == NULL && p.engine == NULL, "default: the library's own threads");
    p.num_threads = THREADS;
    p.parallel_for = serial_for;
    p.engine = &st;
    msa_context *ctx = NULL;
    char err[256];
    CHECK(msa_context_create(&p, &ctx, err, sizeof err) == MSA_OK && ctx, "create: %s", err);
    CHECK(msa_context_num_threads(ctx) == THREADS, "num_threads %d", msa_context_num_threads(ctx));
    msa_context_free(ctx);
    CHECK(atomic_load(&st.calls) == 0, "no parallel stage before a forward");
}

int main(int argc, char **argv)
{
    /* The small shapes keep the test quick: every case runs twice. */
    const char *filter = "small/";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            filter = argv[++i];
        } else {
            fprintf(stderr, "usage: test_engine_pool [--filter TEXT]\n");
            return 2;
        }
    }
    test_context();
    run_sweep("serial", serial_for, filter);
    run_sweep("threads", threads_for, filter);
    return check_finish();
}
