/* The default number of a context's threads (src/core/cpu_budget.c): the
 * cgroup CPU limit read from made-up cgroup trees (v2 cpu.max, v1 CFS
 * quota, ancestors, paths a container does not see, malformed files), the
 * smallest of online CPUs, affinity and limit, and default contexts: as
 * the process's budget says, and one thread when pinned to one CPU. */
#if defined(__linux__)
#define _GNU_SOURCE /* sched_setaffinity */
#include <sched.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/internal.h"
#include "msa/msa.h"

static char base[256];

/* base/rel as a path in buf. */
static const char *at(char *buf, size_t size, const char *rel)
{
    if (snprintf(buf, size, "%s/%s", base, rel) >= (int)size) {
        fprintf(stderr, "path too long: %s/%s\n", base, rel);
        exit(1);
    }
    return buf;
}

/* Creates the directories of base/rel. */
static void make_dirs(const char *rel)
{
    char path[512];
    at(path, sizeof path, rel);
    for (char *p = path + strlen(base) + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0755);
            *p = '/';
        }
    mkdir(path, 0755);
}

/* Writes text to base/rel, creating its directory. */
static void put(const char *rel, const char *text)
{
    char dir[512], path[512];
    if (snprintf(dir, sizeof dir, "%s", rel) >= (int)sizeof dir)
        exit(1);
    char *slash = strrchr(dir, '/');
    if (slash) {
        *slash = '\0';
        make_dirs(dir);
    }
    FILE *f = fopen(at(path, sizeof path, rel), "w");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* The limit with base/proc as /proc/self/cgroup, base/v2 and base/v1 as
 * the two hierarchies' mount points. */
static int limit(void)
{
    char proc[512], v2[512], v1[512];
    return msa_cgroup_cpu_limit(at(proc, sizeof proc, "proc"), at(v2, sizeof v2, "v2"),
                                at(v1, sizeof v1, "v1"));
}

static void remove_tree(void)
{
    char cmd[600];
    if (snprintf(cmd, sizeof cmd, "rm -rf '%s'", base) >= (int)sizeof cmd || system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", base);
}

/* One step of a made-up cgroup tree: write text to base/path (NULL:
 * remove it), then, where expect >= 0, the limit must be expect. */
typedef struct tree_step {
    const char *path, *text;
    int expect;
    const char *what;
} tree_step;

static void run_steps(const char *name, const tree_step *steps, size_t n)
{
    char path[512];
    for (size_t i = 0; i < n; i++) {
        if (steps[i].text)
            put(steps[i].path, steps[i].text);
        else
            unlink(at(path, sizeof path, steps[i].path));
        if (steps[i].expect >= 0) {
            const int got = limit();
            CHECK(got == steps[i].expect, "%s: %s: limit %d, want %d", name, steps[i].what, got,
                  steps[i].expect);
        }
    }
}

static const tree_step v2_steps[] = {
    {"v2/cgroup.controllers", "cpuset cpu io memory pids\n", -1, ""},
    {"proc", "0::/kubepods/pod1/c1\n", 0, "no cpu.max anywhere: no limit"},
    {"v2/kubepods/pod1/c1/cpu.max", "max 100000\n", 0, "\"max\": no limit"},
    {"v2/kubepods/pod1/c1/cpu.max", "250000 100000\n", 2, "2.5 CPUs: 2 threads"},
    {"v2/kubepods/pod1/cpu.max", "150000 100000\n", 1, "a parent's smaller limit holds"},
    {"v2/kubepods/pod1/cpu.max", "max 100000\n", -1, ""},
    {"v2/kubepods/pod1/c1/cpu.max", "20000 100000\n", 1, "a fifth of a CPU: one thread"},
    {"v2/kubepods/pod1/c1/cpu.max", "400000 50000\n", 8, "another period: 8 CPUs"},
    {"v2/kubepods/pod1/c1/cpu.max", "garbage\n", 0, "malformed cpu.max: ignored"},
    {"v2/kubepods/pod1/c1/cpu.max", "300000x 100000\n", 0, "trailing letters: ignored"},
    {"v2/kubepods/pod1/c1/cpu.max", "", 0, "empty cpu.max: ignored"},
    {"v2/kubepods/pod1/c1/cpu.max", "-5 100000\n", 0, "negative quota: ignored"},
    /* A container without a cgroup namespace: its own cgroup is the
     * mount's root, the path names the host's cgroup, which is not there. */
    {"proc", "0::/system.slice/docker-abc.scope\n", -1, ""},
    {"v2/cpu.max", "300000 100000\n", 3, "the root's limit when the path is not mounted"},
    {"proc", "0::/\n", 3, "the root cgroup itself"},
    /* No v2 hierarchy at v2 (a v1 or hybrid machine): its files are not read. */
    {"v2/cgroup.controllers", NULL, 0, "no cgroup.controllers: v2 files not read"},
};

static const tree_step v1_steps[] = {
    {"proc", "12:pids:/docker/abc\n4:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n0::/\n", -1,
     ""},
    {"v1/cpu.cfs_quota_us", "-1\n", -1, ""},
    {"v1/cpu.cfs_period_us", "100000\n", 0, "quota -1: no limit"},
    {"v1/docker/abc/cpu.cfs_quota_us", "600000\n", -1, ""},
    {"v1/docker/abc/cpu.cfs_period_us", "100000\n", 6, "the cgroup's quota: 6 CPUs"},
    {"v1/docker/cpu.cfs_quota_us", "200000\n", -1, ""},
    {"v1/docker/cpu.cfs_period_us", "100000\n", 2, "the parent's smaller quota"},
    {"v1/docker/abc/cpu.cfs_period_us", "0\n", 2, "a zero period is ignored, the parent's holds"},
    {"proc", "4:cpuacct:/docker/abc\n", 0, "no cpu controller in the list: nothing read"},
    {"proc", "4:cpuset,cpu:/docker/abc", 2, "cpu last in the list, no final newline"},
    {"proc", "not a cgroup file\n:::\n1:cpu:relative\n", 0, "malformed lines: no limit"},
    {"proc", NULL, 0, "no cgroup file: no limit"},
};

static void test_threads(void)
{
    msa_cpu_budget b = {8, 0, 0};
    CHECK(msa_cpu_budget_threads(&b) == 8, "online only: 8");
    b.affinity = 3;
    CHECK(msa_cpu_budget_threads(&b) == 3, "affinity 3 of 8: 3");
    b.quota = 2;
    CHECK(msa_cpu_budget_threads(&b) == 2, "quota 2: 2");
    b.quota = 5;
    CHECK(msa_cpu_budget_threads(&b) == 3, "quota above the affinity: 3");
    b = (msa_cpu_budget){1000, 1000, 0};
    CHECK(msa_cpu_budget_threads(&b) == 256, "at most 256 threads");
    b = (msa_cpu_budget){0, 0, 0};
    CHECK(msa_cpu_budget_threads(&b) == 1, "nothing known: one thread");

    msa_cpu_budget here;
    msa_cpu_budget_read(&here);
    CHECK(here.online >= 1, "online CPUs read: %d", here.online);
#if defined(__linux__)
    CHECK(here.affinity >= 1 && here.affinity <= here.online, "affinity mask read: %d of %d online",
          here.affinity, here.online);
#endif
    msa_context_params params;
    msa_context_params_default(&params);
    msa_context *ctx = NULL;
    char err[256];
    CHECK(msa_context_create(&params, &ctx, err, sizeof err) == MSA_OK, "context: %s", err);
    if (ctx) {
        CHECK(msa_context_num_threads(ctx) == msa_cpu_budget_threads(&here),
              "a default context runs %d threads, the budget says %d", msa_context_num_threads(ctx),
              msa_cpu_budget_threads(&here));
        msa_context_free(ctx);
    }
    printf("this process: %d online, %d in the affinity mask, cgroup limit %d\n", here.online,
           here.affinity, here.quota);
}

/* Pinned to one CPU of its affinity mask, the process gets one thread by
 * default (unless its cgroup gives it less, which also means one). */
static void test_pinned(void)
{
#if defined(__linux__)
    cpu_set_t old, one;
    if (sched_getaffinity(0, sizeof old, &old) != 0) {
        SKIP("sched_getaffinity failed");
        return;
    }
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &old))
        cpu++;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (cpu == CPU_SETSIZE || sched_setaffinity(0, sizeof one, &one) != 0) {
        SKIP("could not pin the process to one CPU");
        return;
    }
    msa_cpu_budget b;
    msa_cpu_budget_read(&b);
    CHECK(b.affinity == 1, "pinned: 1 CPU in the affinity mask (got %d)", b.affinity);
    msa_context_params params;
    msa_context_params_default(&params);
    msa_context *ctx = NULL;
    char err[256];
    CHECK(msa_context_create(&params, &ctx, err, sizeof err) == MSA_OK, "context: %s", err);
    if (ctx) {
        CHECK(msa_context_num_threads(ctx) == 1, "pinned: a default context runs %d threads",
              msa_context_num_threads(ctx));
        msa_context_free(ctx);
    }
    CHECK(sched_setaffinity(0, sizeof old, &old) == 0, "affinity restored");
#else
    SKIP("no affinity masks on this system");
#endif
}

/* A new empty directory as base. */
static int fresh_base(void)
{
    const char *tmp = getenv("TMPDIR");
    if (snprintf(base, sizeof base, "%s/msa_cpu_budget_XXXXXX", tmp && *tmp ? tmp : "/tmp") >=
            (int)sizeof base ||
        !mkdtemp(base)) {
        perror("mkdtemp");
        return 0;
    }
    return 1;
}

int main(void)
{
    if (!fresh_base())
        return 1;
    run_steps("v2", v2_steps, sizeof v2_steps / sizeof v2_steps[0]);
    remove_tree();
    if (!fresh_base())
        return 1;
    run_steps("v1", v1_steps, sizeof v1_steps / sizeof v1_steps[0]);
    remove_tree();
    test_threads();
    test_pinned();
    return check_finish();
}
