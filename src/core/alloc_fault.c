/* Allocation-failure injection for tests.  Every allocation the library makes
 * while it builds or grows a plan (host arrays, backend state, device memory,
 * pinned staging) asks msa_alloc_fault() first and treats a 1 as an
 * out-of-memory failure, so that tests can fail the n-th allocation of a call
 * and check that the call leaves the plan as it was. */
#include "core/internal.h"

#include <stdatomic.h>

/* Allocations left before the injected failure; negative: none injected. */
static _Atomic long fault_countdown = -1;
/* Calls of msa_alloc_fault(), and backend work-buffer allocations. */
static _Atomic long allocations, device_allocations;

void msa_count_device_allocation(void)
{
    atomic_fetch_add(&device_allocations, 1);
}

long msa_test_allocations(void)
{
    return atomic_load(&allocations);
}

long msa_test_device_allocations(void)
{
    return atomic_load(&device_allocations);
}

void msa_test_fail_allocation(long n)
{
    atomic_store(&fault_countdown, n);
}

int msa_alloc_fault(void)
{
    atomic_fetch_add(&allocations, 1);
    long left = atomic_load(&fault_countdown);
    while (left >= 0) {
        if (atomic_compare_exchange_weak(&fault_countdown, &left, left - 1))
            return left == 0;
    }
    return 0;
}
