#include "sysinfo.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

size_t sysinfo_llc_bytes(size_t fallback)
{
    /* index3 is the L3 on x86 Linux; fall back to the largest level listed. */
    size_t best = 0;
    for (int idx = 0; idx < 8; idx++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", idx);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        char unit = 0;
        unsigned long long v = 0;
        if (fscanf(f, "%llu%c", &v, &unit) >= 1) {
            if (unit == 'K')
                v <<= 10;
            else if (unit == 'M')
                v <<= 20;
            if (v > best)
                best = (size_t)v;
        }
        fclose(f);
    }
    return best ? best : fallback;
}

size_t sysinfo_phys_bytes(size_t fallback)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : fallback;
}

int sysinfo_exe_dir(char *buf, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", buf, size - 1);
    if (n <= 0 || (size_t)n >= size - 1)
        return -1;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash)
        return -1;
    *slash = '\0';
    return 0;
}

int sysinfo_online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

void sysinfo_cpu_features(char *buf, size_t size)
{
    buf[0] = '\0';
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    size_t used = 0;
    struct {
        int present;
        const char *name;
    } feats[] = {
        {__builtin_cpu_supports("avx2"), "AVX2"},
        {__builtin_cpu_supports("fma"), "FMA"},
        {__builtin_cpu_supports("avx512f"), "AVX-512F"},
        {__builtin_cpu_supports("avx512bf16"), "AVX512-BF16"},
    };
    for (size_t i = 0; i < sizeof feats / sizeof feats[0]; i++)
        if (feats[i].present && used < size)
            used +=
                (size_t)snprintf(buf + used, size - used, "%s%s", used ? " " : "", feats[i].name);
#endif
    if (buf[0] == '\0')
        snprintf(buf, size, "none");
}

void sysinfo_cpu_model(char *buf, size_t size)
{
    snprintf(buf, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *colon = strchr(line, ':');
            if (colon) {
                colon++;
                while (*colon == ' ' || *colon == '\t')
                    colon++;
                colon[strcspn(colon, "\n")] = '\0';
                snprintf(buf, size, "%s", colon);
            }
            break;
        }
    }
    fclose(f);
}
