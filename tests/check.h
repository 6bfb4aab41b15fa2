/*
 * Minimal assertion counting for the test programs: every CHECK counts one
 * pass or one failure, and check_finish() prints the closing
 * "N passed, N failed[, N skipped]" line CTest logs and CI read.
 */
#ifndef MSA_TEST_CHECK_H
#define MSA_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed, check_skipped;

#define CHECK(cond, ...)                                         \
    do {                                                         \
        if (cond) {                                              \
            check_passed++;                                      \
        } else {                                                 \
            check_failed++;                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fputc('\n', stderr);                                 \
        }                                                        \
    } while (0)

#define SKIP(...)                                            \
    do {                                                     \
        check_skipped++;                                     \
        fprintf(stderr, "SKIP %s:%d: ", __FILE__, __LINE__); \
        fprintf(stderr, __VA_ARGS__);                        \
        fputc('\n', stderr);                                 \
    } while (0)

/* Prints the closing line; returns the process exit code. */
static inline int check_finish(void)
{
    fflush(stderr);
    printf("%d passed, %d failed", check_passed, check_failed);
    if (check_skipped)
        printf(", %d skipped", check_skipped);
    printf("\n");
    return check_failed ? 1 : 0;
}

#endif
