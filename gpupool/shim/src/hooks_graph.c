/*
 * Memory the plain allocation calls do not show: graph memory nodes and what memory pools keep.
 *
 * Graph memory nodes (cuGraphAddMemAllocNode, cuGraphAddNode(_v2, _v3) with a MEM_ALLOC node, and the
 * stream-ordered allocations of a captured stream, hooks_mem.c) are charged when the node is created, against the card the node's pool properties name, and given
 * back when the node or its graph is destroyed. The driver backs a node with physical memory when
 * the graph is launched and keeps it for later launches (until cuDeviceGraphMemTrim and the
 * graph's end), and the node's address is valid from its creation: charging from creation to
 * destruction never counts less than the graph can hold, and it refuses an over-limit graph while
 * it is being built, where the caller can still handle CUDA_ERROR_OUT_OF_MEMORY.
 *
 * Memory pools are remembered with the card they allocate on (cuMemPoolCreate and the calls that
 * hand out a device's pools), so an allocation from one is charged to that card.
 *
 * Memory pools: cuMemFreeAsync gives a block back to its pool, which keeps up to its release
 * threshold reserved after the next synchronisation. The library gives the bytes back to the
 * budget at the free, so a pool allowed to keep freed memory (a raised threshold) would let the
 * container hold more than its limit across several pools or beside cuMemAlloc. While a card has a
 * memory limit the release threshold of every pool stays 0 (the driver's default): a request to
 * raise it is passed to the driver as 0, logged once.
 */
#include "shim.h"

static CUresult charge_node(int dev, uint64_t bytes) {
    if (shim_region_charge(dev, bytes) == 0) return CUDA_SUCCESS;
    shim_log(SHIM_LOG_INFO, "refusing a graph memory node of %llu bytes on card %d: the container's limit is %llu bytes",
             (unsigned long long)bytes, dev, (unsigned long long)shim_memory_limit(dev));
    return CUDA_ERROR_OUT_OF_MEMORY;
}

/* The limited card a memory node allocates on, or -1 (not a device pool, not limited, disabled). */
static int node_device(const CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    if (params == NULL || !shim_config()->enabled) return -1;
    const CUmemLocation *where = &params->poolProps.location;
    return where->type == CU_MEM_LOCATION_TYPE_DEVICE && shim_memory_limited(where->id) ? where->id : -1;
}

/* Charge, create, track under the graph; the charge is given back when the driver refuses. */
#define GUARDED_NODE(params, graph, node, call)                                                         \
    do {                                                                                                \
        int dev_ = node_device(params);                                                                 \
        if (dev_ < 0) return (call);                                                                    \
        uint64_t bytes_ = (params)->bytesize;                                                           \
        CUresult status_ = charge_node(dev_, bytes_);                                                   \
        if (status_ != CUDA_SUCCESS) return status_;                                                    \
        status_ = (call);                                                                               \
        if (status_ != CUDA_SUCCESS) shim_region_release(dev_, bytes_);                                 \
        else shim_track_owned(SHIM_KIND_GRAPH_NODE, (uintptr_t)*(node), dev_, bytes_, (uintptr_t)(graph)); \
        return status_;                                                                                 \
    } while (0)

#define REQUIRE(name)                                                                                   \
    if (REAL(name) == NULL) return CUDA_ERROR_NOT_SUPPORTED

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    REQUIRE(cuGraphAddMemAllocNode);
    GUARDED_NODE(nodeParams, hGraph, phGraphNode,
                 REAL(cuGraphAddMemAllocNode)(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

static CUDA_MEM_ALLOC_NODE_PARAMS *alloc_params(CUgraphNodeParams *params) {
    return params != NULL && params->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC ? &params->alloc : NULL;
}

/* A child graph moved into a parent (the only way a graph with memory nodes becomes a child) is
 * the parent's now, and goes with it: so does the charge of its memory nodes. */
static CUresult adopted(CUresult status, CUgraph parent, const CUgraphNodeParams *params) {
    if (status == CUDA_SUCCESS && params != NULL && params->type == CU_GRAPH_NODE_TYPE_GRAPH &&
        params->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE && params->graph.graph != NULL)
        shim_graph_memory_moves((uintptr_t)params->graph.graph, (uintptr_t)parent);
    return status;
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams) {
    REQUIRE(cuGraphAddNode);
    if (alloc_params(nodeParams) == NULL)
        return adopted(REAL(cuGraphAddNode)(phGraphNode, hGraph, dependencies, numDependencies, nodeParams), hGraph,
                       nodeParams);
    GUARDED_NODE(alloc_params(nodeParams), hGraph, phGraphNode,
                 REAL(cuGraphAddNode)(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));
}

/* _v2 (edge data, CUDA 12.3) and _v3 (the same arguments): real is the driver's variant. */
static CUresult add_node_with_edges(__typeof__(&cuGraphAddNode_v2) real, CUgraphNode *phGraphNode, CUgraph hGraph,
                                    const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                                    size_t numDependencies, CUgraphNodeParams *nodeParams) {
    if (alloc_params(nodeParams) == NULL)
        return adopted(real(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams), hGraph,
                       nodeParams);
    GUARDED_NODE(alloc_params(nodeParams), hGraph, phGraphNode,
                 real(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams));
}

CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const CUgraphEdgeData *dependencyData, size_t numDependencies,
                           CUgraphNodeParams *nodeParams) {
    REQUIRE(cuGraphAddNode_v2);
    return add_node_with_edges(REAL(cuGraphAddNode_v2), phGraphNode, hGraph, dependencies, dependencyData,
                               numDependencies, nodeParams);
}

CUresult cuGraphAddNode_v3(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const CUgraphEdgeData *dependencyData, size_t numDependencies,
                           CUgraphNodeParams *nodeParams) {
    REQUIRE(cuGraphAddNode_v3);
    return add_node_with_edges(REAL(cuGraphAddNode_v3), phGraphNode, hGraph, dependencies, dependencyData,
                               numDependencies, nodeParams);
}

CUresult cuGraphDestroyNode(CUgraphNode hNode) {
    REQUIRE(cuGraphDestroyNode);
    int dev;
    uint64_t bytes, graph;
    int tracked = shim_untrack_owned(SHIM_KIND_GRAPH_NODE, (uintptr_t)hNode, &dev, &bytes, &graph);
    CUresult status = REAL(cuGraphDestroyNode)(hNode);
    if (tracked && status == CUDA_SUCCESS) shim_region_release(dev, bytes);
    else if (tracked) shim_track_owned(SHIM_KIND_GRAPH_NODE, (uintptr_t)hNode, dev, bytes, graph);
    return status;
}

/* A graph's memory outlives it while an executable graph made from it lives (hooks_graph_exec.c). */
CUresult cuGraphDestroy(CUgraph hGraph) {
    REQUIRE(cuGraphDestroy);
    CUresult status = REAL(cuGraphDestroy)(hGraph);
    if (status == CUDA_SUCCESS && hGraph != NULL) shim_graph_memory_ends((uintptr_t)hGraph);
    return status;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    REQUIRE(cuMemPoolSetAttribute);
    static int warned;
    uint64_t zero = 0;
    if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD && value != NULL && *(const cuuint64_t *)value != 0 &&
        shim_config()->enabled && shim_any_memory_limited()) {
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            shim_log(SHIM_LOG_INFO, "memory pools keep a release threshold of 0 under a memory limit (asked for %llu)",
                     (unsigned long long)*(const cuuint64_t *)value);
        value = &zero;
    }
    return REAL(cuMemPoolSetAttribute)(pool, attr, value);
}

/* Where a pool allocates, so cuMemAllocFromPoolAsync charges that card and not the current one
 * (a pool may belong to another card; a host pool's memory is not device memory). */
static void note_pool(CUresult status, CUmemoryPool pool, const CUmemLocation *where) {
    if (status != CUDA_SUCCESS || pool == NULL || where == NULL || !shim_config()->enabled) return;
    int dev = where->type == CU_MEM_LOCATION_TYPE_DEVICE ? where->id : SHIM_POOL_HOST, old;
    uint64_t bytes;
    shim_untrack(SHIM_KIND_POOL, (uintptr_t)pool, &old, &bytes); /* a default pool is asked for often */
    shim_track(SHIM_KIND_POOL, (uintptr_t)pool, dev, 0);
}

int shim_pool_device(CUmemoryPool pool, int fallback) {
    int dev;
    if (pool == NULL || !shim_lookup(SHIM_KIND_POOL, (uintptr_t)pool, &dev)) return fallback;
    return shim_memory_limited(dev) ? dev : -1;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    REQUIRE(cuMemPoolCreate);
    CUmemPoolProps on_card;
    const CUmemPoolProps *asked = poolProps;
    if (poolProps != NULL && poolProps->location.type == CU_MEM_LOCATION_TYPE_DEVICE) { /* a virtual ordinal's card */
        on_card = *poolProps;
        on_card.location.id = shim_card_of(poolProps->location.id);
        asked = &on_card;
    }
    CUresult status = REAL(cuMemPoolCreate)(pool, asked);
    note_pool(status, pool != NULL ? *pool : NULL, poolProps != NULL ? &poolProps->location : NULL);
    return status;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    REQUIRE(cuMemPoolDestroy);
    CUresult status = REAL(cuMemPoolDestroy)(pool);
    int dev;
    uint64_t bytes;
    if (status == CUDA_SUCCESS) shim_untrack(SHIM_KIND_POOL, (uintptr_t)pool, &dev, &bytes);
    return status;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    REQUIRE(cuDeviceGetDefaultMemPool);
    CUresult status = REAL(cuDeviceGetDefaultMemPool)(pool_out, shim_card_of(dev));
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    note_pool(status, pool_out != NULL ? *pool_out : NULL, &where);
    return status;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    REQUIRE(cuDeviceGetMemPool);
    CUresult status = REAL(cuDeviceGetMemPool)(pool, shim_card_of(dev));
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev};
    note_pool(status, pool != NULL ? *pool : NULL, &where);
    return status;
}

CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, int type) {
    REQUIRE(cuMemGetDefaultMemPool);
    CUresult status = REAL(cuMemGetDefaultMemPool)(pool_out, location, type);
    note_pool(status, pool_out != NULL ? *pool_out : NULL, location);
    return status;
}

CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, int type) {
    REQUIRE(cuMemGetMemPool);
    CUresult status = REAL(cuMemGetMemPool)(pool, location, type);
    note_pool(status, pool != NULL ? *pool : NULL, location);
    return status;
}
