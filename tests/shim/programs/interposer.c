/*
 * An interposer of the common kind (profilers, fakers): it wraps getppid and finds the real one
 * with dlsym(RTLD_NEXT). Loaded after the interception library, it must get libc's function,
 * not its own (which would recurse until the stack runs out).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <unistd.h>

#define MARK 1000000

__attribute__((visibility("default"))) pid_t getppid(void) {
    pid_t (*real)(void) = (pid_t(*)(void))dlsym(RTLD_NEXT, "getppid");
    return real == NULL || real == getppid ? -1 : real() + MARK;
}
