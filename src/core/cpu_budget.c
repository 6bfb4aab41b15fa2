/* How many CPUs this process may use: the default number of a context's
 * worker threads.  The online CPUs of the machine are only an upper bound:
 * a process pinned to some of them (taskset, a container's cpuset) runs on
 * those, and a cgroup CPU bandwidth limit (a container's --cpus, a
 * Kubernetes CPU limit) gives the whole cgroup only quota / period CPUs'
 * worth of time.  A pool wider than that oversubscribes the CPUs it gets:
 * each parallel stage then waits for threads the kernel has descheduled
 * (2 cores, 32K decode step: 3 threads 2x, 8 threads 3.5x the time of 2),
 * and a throttled cgroup stops every thread until the next period. */
#if defined(__linux__)
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT_S */
#endif

#include "core/internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__linux__)
#include <sched.h>
#endif

/* The most worker threads a default context starts. */
#define MSA_MAX_DEFAULT_THREADS 256

/* The text of a small file, NUL-terminated (0), or -1 when it cannot be
 * read or does not fit. */
static int read_small_file(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, size - 1, f);
    int full = n == size - 1 && fgetc(f) != EOF;
    fclose(f);
    if (full)
        return -1;
    buf[n] = '\0';
    return 0;
}

/* A decimal integer at *s (after blanks), which must be followed by a
 * blank, a newline or the end; *s moves past it.  0 when there is none. */
static int parse_int64(const char **s, long long *v)
{
    const char *p = *s;
    while (*p == ' ' || *p == '\t')
        p++;
    char *end;
    errno = 0;
    long long x = strtoll(p, &end, 10);
    if (end == p || errno != 0 || (*end != '\0' && *end != ' ' && *end != '\n' && *end != '\t'))
        return 0;
    *v = x;
    *s = end;
    return 1;
}

/* Whole CPUs of a limit of quota microseconds every period: at least one
 * (a limit below one CPU still runs one thread), rounded down (a thread
 * more than the limit makes the cgroup wait for the next period). */
static int quota_cpus(long long quota, long long period)
{
    long long n = quota / period;
    if (n < 1)
        return 1;
    return n > MSA_MAX_DEFAULT_THREADS ? MSA_MAX_DEFAULT_THREADS : (int)n;
}

/* The limit a cgroup directory sets: cgroup v2 cpu.max ("max P" or "Q P"),
 * or v1 cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us; 0 when it sets
 * none or its files are missing or malformed. */
static int dir_limit(const char *dir, int v2)
{
    char path[4096], text[256];
    long long quota, period;
    if (v2) {
        if (snprintf(path, sizeof path, "%s/cpu.max", dir) >= (int)sizeof path ||
            read_small_file(path, text, sizeof text) != 0)
            return 0;
        const char *s = text;
        if (!parse_int64(&s, &quota) || !parse_int64(&s, &period)) /* "max ..." */
            return 0;
    } else {
        if (snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir) >= (int)sizeof path ||
            read_small_file(path, text, sizeof text) != 0)
            return 0;
        const char *s = text;
        if (!parse_int64(&s, &quota))
            return 0;
        if (snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir) >= (int)sizeof path ||
            read_small_file(path, text, sizeof text) != 0)
            return 0;
        s = text;
        if (!parse_int64(&s, &period))
            return 0;
    }
    if (quota <= 0 || period <= 0)
        return 0;
    return quota_cpus(quota, period);
}

/* The smallest limit of the cgroup at root + rel and of each of its
 * ancestors up to root (each one's limit holds for everything below it).
 * Directories that do not exist are passed over: without a cgroup
 * namespace, a container sees its own cgroup at root and the host's path
 * in /proc/self/cgroup. */
static int path_limit(const char *root, const char *rel, int v2)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s%s", root, rel) >= (int)sizeof dir)
        return 0;
    const size_t root_len = strlen(root);
    int best = 0;
    for (;;) {
        size_t len = strlen(dir);
        while (len > root_len && dir[len - 1] == '/') /* "/a/b/" as "/a/b" */
            dir[--len] = '\0';
        const int lim = dir_limit(dir, v2);
        if (lim > 0 && (best == 0 || lim < best))
            best = lim;
        if (len <= root_len)
            return best;
        char *slash = strrchr(dir + root_len, '/');
        if (!slash) /* rel without a leading '/': its top level was the last */
            dir[root_len] = '\0';
        else
            *slash = '\0';
    }
}

/* Whether a v1 controller list ("cpu,cpuacct") names the cpu controller. */
static int names_cpu_controller(const char *list, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && list[j] != ',')
            j++;
        if (j - i == 3 && memcmp(list + i, "cpu", 3) == 0)
            return 1;
        i = j + 1;
    }
    return 0;
}

int msa_cgroup_cpu_limit(const char *proc_cgroup, const char *v2_root, const char *v1_root)
{
    char text[8192];
    if (read_small_file(proc_cgroup, text, sizeof text) != 0)
        return 0;
    char probe[4096];
    const int v2_mounted = snprintf(probe, sizeof probe, "%s/cgroup.controllers", v2_root) <
                               (int)sizeof probe &&
                           access(probe, R_OK) == 0;
    int best = 0;
    /* lines "id:controllers:path"; v2's is "0::path" */
    for (char *line = text; *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 && c2[1] == '/') {
            int lim = 0;
            if (c1 == line + 1 && line[0] == '0' && c2 == c1 + 1) {
                if (v2_mounted)
                    lim = path_limit(v2_root, c2 + 1, 1);
            } else if (names_cpu_controller(c1 + 1, (size_t)(c2 - c1 - 1))) {
                lim = path_limit(v1_root, c2 + 1, 0);
            }
            if (lim > 0 && (best == 0 || lim < best))
                best = lim;
        }
        if (!nl)
            break;
        line = nl + 1;
    }
    return best;
}

void msa_cpu_budget_read(msa_cpu_budget *b)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    b->online = online > 0 ? (online > 1 << 20 ? 1 << 20 : (int)online) : 1;
    b->affinity = 0;
    b->quota = 0;
#if defined(__linux__)
    /* Sets sized for up to 64K CPUs: a fixed cpu_set_t holds 1024. */
    const int max_cpus = 65536;
    cpu_set_t *set = CPU_ALLOC(max_cpus);
    if (set) {
        const size_t size = CPU_ALLOC_SIZE(max_cpus);
        CPU_ZERO_S(size, set);
        if (sched_getaffinity(0, size, set) == 0)
            b->affinity = CPU_COUNT_S(size, set);
        CPU_FREE(set);
    }
    /* v1: systemd and container runtimes link cpu to cpu,cpuacct; some
     * systems mount only the latter */
    const char *v1 = access("/sys/fs/cgroup/cpu", F_OK) == 0 ? "/sys/fs/cgroup/cpu"
                                                             : "/sys/fs/cgroup/cpu,cpuacct";
    b->quota = msa_cgroup_cpu_limit("/proc/self/cgroup", "/sys/fs/cgroup", v1);
#endif
}

int msa_cpu_budget_threads(const msa_cpu_budget *b)
{
    int n = b->online > 0 ? b->online : 1;
    if (b->affinity > 0 && b->affinity < n)
        n = b->affinity;
    if (b->quota > 0 && b->quota < n)
        n = b->quota;
    return n > MSA_MAX_DEFAULT_THREADS ? MSA_MAX_DEFAULT_THREADS : n;
}
