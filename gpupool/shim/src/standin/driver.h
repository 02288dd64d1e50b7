/* What the stand-in libcuda.so.1's parts share: cuda.c owns the cards' memory, vmm.c builds VMM
 * allocations on it. */
#ifndef GPUPOOL_STANDIN_DRIVER_H
#define GPUPOOL_STANDIN_DRIVER_H

#include "../cuda_types.h"

/* The calling thread's current card, -1 without a context. */
int standin_current_device(void);
CUresult standin_checked_device(int dev);
/* Take bytes of a card's memory (a key names them), and give them back. */
CUresult standin_allocate(int dev, uint64_t bytes, unsigned long long *key);
CUresult standin_release(uint64_t key);
/* Let VMM allocations go that only an exported file kept, once that file is closed. */
void standin_vmm_settle(void);

#endif
