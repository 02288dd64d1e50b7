/*
 * The stand-in driver's card timeline, shared by every process on this "machine" through a file
 * (GPUPOOL_STANDIN_STATE): kernels of all processes run one after another on a card, each for the
 * configured time, so busy time per card and per process can be measured the way NVML reports it.
 */
#ifndef GPUPOOL_STANDIN_STATE_H
#define GPUPOOL_STANDIN_STATE_H

#include <stdint.h>

#define STANDIN_MAX_DEVICES 4
#define STANDIN_RING 32768

struct standin_settings {
    int devices;
    uint64_t memory_bytes;
    uint64_t kernel_ns;
    uint64_t queue_ns;   /* a launch blocks while the card has more than this much queued work */
    uint64_t window_ns;  /* NVML's sample period when a caller gives no timestamp */
    int pid_offset;      /* added to a process's own pid: the pid a driver outside its pid namespace sees */
    int shared_memory;   /* GPUPOOL_STANDIN_SHARED_MEMORY=1: the cards' memory is the machine's, not each process's */
};

const struct standin_settings *standin_settings(void);
uint64_t standin_now_ns(void);
/* The pid the driver (and NVML) know a process by: its own, plus GPUPOOL_STANDIN_PID_OFFSET. */
int standin_driver_pid(int own_pid);
/* Queue a kernel of the given length on a card for pid; returns when it ends (CLOCK_MONOTONIC). */
uint64_t standin_enqueue(int dev, uint64_t duration_ns, int pid);
/* Busy nanoseconds of a card within [from, to), for one pid or (pid 0) for all. */
uint64_t standin_busy(int dev, int pid, uint64_t from_ns, uint64_t to_ns);
/* With shared memory (GPUPOOL_STANDIN_SHARED_MEMORY=1) a card holds what every live process allocated on it,
 * as a real card does, and a process's part is given back when it exits however it ends (the driver
 * frees a dead process's memory); otherwise each process has the whole card. take: 1 when the bytes
 * fit beside the others' (always without sharing), 0 when the card is full. */
#define STANDIN_MAX_HOLDERS 64
int standin_card_take(int dev, uint64_t bytes);
void standin_card_give(int dev, uint64_t bytes);
/* The distinct pids that had work on a card within [from, to). */
int standin_pids(int dev, uint64_t from_ns, uint64_t to_ns, int *pids, int max);
/* NVML's per-process utilisation queries answered on this machine (by any process), counted so that
 * the stand-in's teardown at exit can wait for some (teardown.c). */
void standin_count_utilisation_query(void);
uint64_t standin_utilisation_queries(void);

#endif
