/*
 * The stand-in driver's teardown at process exit. A real libcuda destroys the process's contexts in
 * its own destructor, which runs after the destructors of an interception library preloaded before
 * it, and that takes a while, during which the process's other threads (the library's compute
 * controller among them) still run. GPUPOOL_STANDIN_TEARDOWN_QUERIES=N makes that window certain
 * for tests: the destructor returns only after N more NVML per-process utilisation queries have been
 * made on this machine, or after TEARDOWN_MAX_NS if fewer come. Unset or 0: it returns at once.
 */
#include <stdlib.h>
#include <time.h>

#include "state.h"

#define TEARDOWN_MAX_NS 5000000000ull
#define TEARDOWN_POLL_NS 1000000L

__attribute__((destructor)) static void standin_teardown(void) {
    const char *text = getenv("GPUPOOL_STANDIN_TEARDOWN_QUERIES");
    unsigned long long wanted = text != NULL ? strtoull(text, NULL, 10) : 0;
    if (wanted == 0) return;
    uint64_t until = standin_utilisation_queries() + wanted, give_up = standin_now_ns() + TEARDOWN_MAX_NS;
    struct timespec poll = {0, TEARDOWN_POLL_NS};
    while (standin_utilisation_queries() < until && standin_now_ns() < give_up) nanosleep(&poll, NULL);
}
