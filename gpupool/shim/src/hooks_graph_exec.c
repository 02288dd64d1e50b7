/*
 * What becomes of a graph's memory nodes when the graph is copied or instantiated.
 *
 * The driver backs a graph's memory nodes with physical memory when an executable graph made from
 * it is launched, and that executable keeps the memory for later launches until it is destroyed:
 * destroying the graph itself (as frameworks do right after instantiating it) frees nothing while
 * the executable lives. So the charge of a graph's memory nodes (hooks_graph.c) passes to its
 * executable graph when the graph is destroyed first, and goes back when the last of the two is
 * destroyed. CUDA documents that a graph with memory nodes cannot be cloned and has at most one
 * executable graph at a time; a driver that allows either anyway gets each copy charged like the
 * original (its launches can hold the same memory again), refused with CUDA_ERROR_OUT_OF_MEMORY
 * past the limit, so the rule never counts less than the card can hold.
 */
#include "shim.h"

static const int memory_kinds[] = {SHIM_KIND_GRAPH_NODE, SHIM_KIND_CAPTURED, SHIM_KIND_GRAPH_COPY};
#define MEMORY_KINDS (sizeof memory_kinds / sizeof *memory_kinds)

#define REQUIRE(name)                                                                                   \
    if (REAL(name) == NULL) return CUDA_ERROR_NOT_SUPPORTED

static int has_memory(uint64_t owner) {
    for (size_t k = 0; k < MEMORY_KINDS; k++)
        if (shim_owns_any(memory_kinds[k], owner)) return 1;
    return 0;
}

static void release_memory(uint64_t owner) {
    for (size_t k = 0; k < MEMORY_KINDS; k++) shim_release_owned(memory_kinds[k], owner);
}

/* Charge copy as much as original's memory nodes hold, card by card; -1 (nothing charged) past a limit. */
static int charge_copy(uint64_t original, uint64_t copy) {
    uint64_t sums[SHIM_MAX_DEVICES] = {0};
    for (size_t k = 0; k < MEMORY_KINDS; k++) shim_sum_owned(memory_kinds[k], original, sums);
    for (int dev = 0; dev < SHIM_MAX_DEVICES; dev++) {
        if (sums[dev] == 0) continue;
        if (shim_charge(dev, sums[dev], "a copy of a graph's memory nodes") != CUDA_SUCCESS) {
            release_memory(copy); /* the cards charged so far */
            return -1;
        }
        shim_track_owned(SHIM_KIND_GRAPH_COPY, (copy << 4) | (uint64_t)dev, dev, sums[dev], copy);
    }
    return 0;
}

void shim_graph_memory_ends(uint64_t graph) {
    uint64_t exec = shim_find_owned(SHIM_KIND_EXEC, graph);
    if (exec == 0) {
        release_memory(graph);
        return;
    }
    for (size_t k = 0; k < MEMORY_KINDS; k++) shim_reown(memory_kinds[k], graph, exec);
    shim_reown(SHIM_KIND_EXEC, graph, exec); /* the executable graph now holds the memory itself */
}

void shim_graph_memory_moves(uint64_t child, uint64_t parent) {
    for (size_t k = 0; k < MEMORY_KINDS; k++) shim_reown(memory_kinds[k], child, parent);
}

CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph) {
    REQUIRE(cuGraphClone);
    CUresult status = REAL(cuGraphClone)(phGraphClone, originalGraph);
    if (status != CUDA_SUCCESS || !shim_config()->enabled || !has_memory((uintptr_t)originalGraph)) return status;
    if (charge_copy((uintptr_t)originalGraph, (uintptr_t)*phGraphClone) == 0) return status;
    if (REAL(cuGraphDestroy) != NULL) REAL(cuGraphDestroy)(*phGraphClone);
    *phGraphClone = NULL;
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* After a successful instantiation: remember the executable graph of a graph with memory nodes;
 * a second one at the same time is a copy. CUDA_SUCCESS, or OUT_OF_MEMORY with exec destroyed. */
static CUresult instantiated(CUgraphExec exec, CUgraph graph) {
    if (!shim_config()->enabled || exec == NULL || !has_memory((uintptr_t)graph)) return CUDA_SUCCESS;
    int copy = shim_find_owned(SHIM_KIND_EXEC, (uintptr_t)graph) != 0;
    if (copy && charge_copy((uintptr_t)graph, (uintptr_t)exec) != 0) {
        if (REAL(cuGraphExecDestroy) != NULL) REAL(cuGraphExecDestroy)(exec);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    shim_track_owned(SHIM_KIND_EXEC, (uintptr_t)exec, -1, 0, copy ? (uintptr_t)exec : (uintptr_t)graph);
    return CUDA_SUCCESS;
}

#define INSTANTIATE(name, ...)                                                                          \
    REQUIRE(name);                                                                                      \
    CUresult status = REAL(name)(__VA_ARGS__);                                                          \
    if (status != CUDA_SUCCESS) return status;                                                          \
    status = instantiated(*phGraphExec, hGraph);                                                        \
    if (status != CUDA_SUCCESS) *phGraphExec = NULL;                                                    \
    return status

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    INSTANTIATE(cuGraphInstantiateWithFlags, phGraphExec, hGraph, flags);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    INSTANTIATE(cuGraphInstantiateWithParams, phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    INSTANTIATE(cuGraphInstantiateWithParams_ptsz, phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize) {
    INSTANTIATE(cuGraphInstantiate, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize) {
    INSTANTIATE(cuGraphInstantiate_v2, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    REQUIRE(cuGraphExecDestroy);
    CUresult status = REAL(cuGraphExecDestroy)(hGraphExec);
    int dev;
    uint64_t bytes;
    if (status == CUDA_SUCCESS && hGraphExec != NULL && shim_untrack(SHIM_KIND_EXEC, (uintptr_t)hGraphExec, &dev, &bytes))
        release_memory((uintptr_t)hGraphExec); /* what it copied, or took over from its destroyed graph */
    return status;
}
