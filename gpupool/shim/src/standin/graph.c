/*
 * The stand-in driver's graphs and stream capture. Graphs are numbers; a memory node is its
 * allocation's address, any other node an odd number. A memory node takes its memory when it is
 * created; the memory belongs to its graph, or to the executable graph made from it once the graph
 * is destroyed, and goes when its owner goes. A stream being captured records into a graph: its
 * stream-ordered allocations are memory nodes (cuda.c asks standin_capture_graph).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../cuda_api.h"
#include "driver.h"

API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags);
API CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode);
API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* captures and executable graphs */

/* Streams being captured, and the graph each records into. Streams are any value but the legacy
 * stream (NULL to the plain entry points, CU_STREAM_LEGACY), which cannot be captured; NULL to the
 * _ptsz entry points and CU_STREAM_PER_THREAD to any are the calling thread's own default stream. */
#define MAX_CAPTURES 16
static struct {
    CUstream stream;
    CUgraph graph;
} captures[MAX_CAPTURES];
static uint64_t next_graph = 1, next_node = 1;
static __thread char per_thread_stream; /* its address names this thread's default stream */

static CUstream stream_of(CUstream stream, int per_thread) {
    if (stream == NULL && per_thread) stream = CU_STREAM_PER_THREAD;
    if (stream == CU_STREAM_LEGACY) return NULL;
    return stream == CU_STREAM_PER_THREAD ? (CUstream)&per_thread_stream : stream;
}

static CUgraph captured_into(CUstream stream) {
    CUgraph graph = NULL;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CAPTURES && stream != NULL; i++)
        if (captures[i].stream == stream) graph = captures[i].graph;
    pthread_mutex_unlock(&lock);
    return graph;
}

static CUresult begin_capture(CUstream stream) {
    if (stream == NULL || captured_into(stream) != NULL) return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CAPTURES; i++) {
        if (captures[i].stream != NULL) continue;
        captures[i].stream = stream;
        captures[i].graph = (CUgraph)(uintptr_t)__atomic_fetch_add(&next_graph, 1, __ATOMIC_RELAXED);
        status = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult end_capture(CUstream stream, CUgraph *phGraph) {
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_CAPTURES && stream != NULL; i++) {
        if (captures[i].stream != stream) continue;
        *phGraph = captures[i].graph;
        captures[i].stream = NULL;
        status = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}

static CUresult capture_info(CUstream stream, int *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,
                             const CUgraphNode **dependencies_out, size_t *numDependencies_out) {
    CUgraph graph = captured_into(stream);
    if (captureStatus_out == NULL) return CUDA_ERROR_INVALID_VALUE;
    *captureStatus_out = graph != NULL ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id_out != NULL) *id_out = (uintptr_t)graph;
    if (graph_out != NULL) *graph_out = graph;
    if (dependencies_out != NULL) *dependencies_out = NULL;
    if (numDependencies_out != NULL) *numDependencies_out = 0;
    return CUDA_SUCCESS;
}


#define CAPTURE_INFO_PARAMS                                                                             \
    CUstream hStream, int *captureStatus_out, cuuint64_t *id_out, CUgraph *graph_out,                   \
        const CUgraphNode **dependencies_out, size_t *numDependencies_out
#define CAPTURE_INFO_ARGS captureStatus_out, id_out, graph_out, dependencies_out, numDependencies_out
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode);
API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
API CUresult cuStreamGetCaptureInfo_v2_ptsz(CAPTURE_INFO_PARAMS);

CUresult cuStreamBeginCapture_v2(CUstream hStream, int mode) { return (void)mode, begin_capture(stream_of(hStream, 0)); }
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, int mode) {
    return (void)mode, begin_capture(stream_of(hStream, 1));
}
CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) { return end_capture(stream_of(hStream, 0), phGraph); }
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    return end_capture(stream_of(hStream, 1), phGraph);
}
CUresult cuStreamGetCaptureInfo_v2(CAPTURE_INFO_PARAMS) { return capture_info(stream_of(hStream, 0), CAPTURE_INFO_ARGS); }
CUresult cuStreamGetCaptureInfo_v2_ptsz(CAPTURE_INFO_PARAMS) {
    return capture_info(stream_of(hStream, 1), CAPTURE_INFO_ARGS);
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
    (void)flags;
    *phGraph = (CUgraph)(uintptr_t)__atomic_fetch_add(&next_graph, 1, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

static CUresult add_memory_node(CUgraphNode *node, CUgraph graph, CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    if (graph == NULL || params == NULL || params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = standin_checked_device(params->poolProps.location.id);
    if (status != CUDA_SUCCESS) return status;
    unsigned long long key;
    status = standin_allocate_for_graph(params->poolProps.location.id, params->bytesize, (uintptr_t)graph, &key);
    if (status != CUDA_SUCCESS) return status;
    params->dptr = key;
    *node = (CUgraphNode)(uintptr_t)key;
    return CUDA_SUCCESS;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    (void)dependencies;
    (void)numDependencies;
    return add_memory_node(phGraphNode, hGraph, nodeParams);
}

CUresult cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                        size_t numDependencies, CUgraphNodeParams *nodeParams) {
    (void)dependencies;
    (void)numDependencies;
    if (hGraph == NULL || nodeParams == NULL) return CUDA_ERROR_INVALID_VALUE;
    if (nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) return add_memory_node(phGraphNode, hGraph, &nodeParams->alloc);
    if (nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH && nodeParams->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE) {
        standin_hand_over((uintptr_t)nodeParams->graph.graph, (uintptr_t)hGraph, NULL); /* the parent's now */
    }
    *phGraphNode = (CUgraphNode)(uintptr_t)(__atomic_fetch_add(&next_node, 2, __ATOMIC_RELAXED));
    return CUDA_SUCCESS;
}

CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const CUgraphEdgeData *dependencyData, size_t numDependencies,
                           CUgraphNodeParams *nodeParams) {
    (void)dependencyData;
    return cuGraphAddNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
}

CUresult cuGraphAddNode_v3(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                           const CUgraphEdgeData *dependencyData, size_t numDependencies,
                           CUgraphNodeParams *nodeParams) {
    return cuGraphAddNode_v2(phGraphNode, hGraph, dependencies, dependencyData, numDependencies, nodeParams);
}

CUresult cuGraphDestroyNode(CUgraphNode hNode) {
    uint64_t key = (uintptr_t)hNode;
    if (key & 1) return CUDA_SUCCESS;
    return standin_release(key);
}

/* Memory nodes belong to their graph, or to the executable graph made from it once the graph is
 * destroyed (it keeps the memory for its launches), and go when their owner goes. */
#define EXEC_BASE (1ull << 44)
#define MAX_INSTANCES 64
static struct {
    uint64_t exec, graph; /* exec 0: free */
} instances[MAX_INSTANCES];
static uint64_t next_exec = EXEC_BASE;

static uint64_t instance_of(uint64_t graph) {
    for (int i = 0; i < MAX_INSTANCES; i++)
        if (instances[i].exec != 0 && instances[i].graph == graph) return instances[i].exec;
    return 0;
}

/* GPUPOOL_STANDIN_GRAPH_COPIES=1: clones and extra instantiations of a graph with memory nodes
 * work and take their own memory (CUDA refuses both; this plays a driver that would not). */
static int copies_allowed(void) {
    const char *value = getenv("GPUPOOL_STANDIN_GRAPH_COPIES");
    return value != NULL && strcmp(value, "1") == 0;
}

/* The memory of graph's nodes, allocated again for copy. */
static CUresult copy_memory(uint64_t graph, uint64_t copy) {
    uint64_t bytes[STANDIN_MAX_DEVICES] = {0};
    standin_hand_over(graph, graph, bytes);
    for (int dev = 0; dev < STANDIN_MAX_DEVICES; dev++) {
        unsigned long long key;
        if (bytes[dev] == 0 || standin_allocate_for_graph(dev, bytes[dev], copy, &key) == CUDA_SUCCESS) continue;
        standin_hand_over(copy, 0, NULL);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

static int has_memory(uint64_t graph) {
    uint64_t bytes[STANDIN_MAX_DEVICES] = {0}, total = 0;
    standin_hand_over(graph, graph, bytes);
    for (int dev = 0; dev < STANDIN_MAX_DEVICES; dev++) total += bytes[dev];
    return total != 0;
}

CUresult cuGraphDestroy(CUgraph hGraph) {
    if (hGraph == NULL) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    uint64_t exec = instance_of((uintptr_t)hGraph);
    standin_hand_over((uintptr_t)hGraph, exec, NULL);
    for (int i = 0; i < MAX_INSTANCES; i++)
        if (instances[i].exec != 0 && instances[i].graph == (uintptr_t)hGraph) instances[i].graph = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph) {
    if (phGraphClone == NULL || originalGraph == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t clone = __atomic_fetch_add(&next_graph, 1, __ATOMIC_RELAXED);
    if (has_memory((uintptr_t)originalGraph)) {
        if (!copies_allowed()) return CUDA_ERROR_NOT_SUPPORTED;
        CUresult status = copy_memory((uintptr_t)originalGraph, clone);
        if (status != CUDA_SUCCESS) return status;
    }
    *phGraphClone = (CUgraph)(uintptr_t)clone;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    (void)flags;
    if (phGraphExec == NULL || hGraph == NULL) return CUDA_ERROR_INVALID_VALUE;
    uint64_t exec = __atomic_fetch_add(&next_exec, 1, __ATOMIC_RELAXED);
    pthread_mutex_lock(&lock);
    int taken = instance_of((uintptr_t)hGraph) != 0;
    pthread_mutex_unlock(&lock);
    if (taken && has_memory((uintptr_t)hGraph)) { /* CUDA: one executable graph at a time */
        if (!copies_allowed()) return CUDA_ERROR_INVALID_VALUE;
        CUresult status = copy_memory((uintptr_t)hGraph, exec);
        if (status != CUDA_SUCCESS) return status;
    }
    CUresult status = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_INSTANCES; i++) {
        if (instances[i].exec != 0) continue;
        instances[i].exec = exec;
        instances[i].graph = (uintptr_t)hGraph;
        status = CUDA_SUCCESS;
        break;
    }
    pthread_mutex_unlock(&lock);
    if (status == CUDA_SUCCESS) *phGraphExec = (CUgraphExec)(uintptr_t)exec;
    return status;
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, instantiateParams != NULL ? instantiateParams->flags : 0);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    return cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams);
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize) {
    (void)phErrorNode, (void)logBuffer, (void)bufferSize;
    return cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize) {
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CUresult status = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_INSTANCES && hGraphExec != NULL; i++) {
        if (instances[i].exec != (uintptr_t)hGraphExec) continue;
        instances[i].exec = 0;
        standin_hand_over((uintptr_t)hGraphExec, 0, NULL);
        status = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&lock);
    return status;
}


CUgraph standin_capture_graph(CUstream stream, int per_thread) { return captured_into(stream_of(stream, per_thread)); }
