/* The cuBLASLt calls PyTorch's addmm makes (at::cuda::blas::gemm_and_bias, F.linear with a bias),
 * against gpupool's libcublasLt.so.12, with gpupool's cuBLAS handle cast to a cublasLtHandle_t as
 * PyTorch does (its getCurrentCUDABlasLtHandle on CUDA). Prints name=status words; a crash is the
 * failure this probe exists to catch. Pointers the refused calls must not read are unmapped
 * addresses (UNREAD). Usage: cublaslt_probe addmm | handles */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef int cublasStatus_t;
typedef struct cublasContext *cublasHandle_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef void *desc_t;
typedef struct {
    uint64_t algo[8];
    size_t workspace_size;
    cublasStatus_t state;
    float waves;
    int reserved[4];
} heuristic_result;

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version);
cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
size_t cublasLtGetVersion(void);
size_t cublasLtGetCudartVersion(void);
cublasStatus_t cublasLtGetProperty(int type, int *value);
const char *cublasLtGetStatusName(cublasStatus_t status);
const char *cublasLtGetStatusString(cublasStatus_t status);
cublasStatus_t cublasLtMatmulDescCreate(desc_t *desc, int compute_type, int scale_type);
cublasStatus_t cublasLtMatmulDescSetAttribute(desc_t desc, int attribute, const void *buffer, size_t bytes);
cublasStatus_t cublasLtMatmulDescDestroy(desc_t desc);
cublasStatus_t cublasLtMatrixLayoutCreate(desc_t *layout, int type, uint64_t rows, uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutDestroy(desc_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(desc_t *preference);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(desc_t preference, int attribute, const void *buffer,
                                                    size_t bytes);
cublasStatus_t cublasLtMatmulPreferenceDestroy(desc_t preference);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, desc_t desc, desc_t a, desc_t b, desc_t c,
                                              desc_t d, desc_t preference, int requested, heuristic_result *results,
                                              int *returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, desc_t desc, const void *alpha, const void *a, desc_t adesc,
                              const void *b, desc_t bdesc, const void *beta, const void *c, desc_t cdesc, void *d,
                              desc_t ddesc, const void *algo, void *workspace, size_t workspace_bytes,
                              void *stream);

#define UNREAD ((void *)(uintptr_t)0x10)
#define COMPUTE_32F 68
#define R_32F 0
#define TRANSA 3
#define EPILOGUE_BIAS_ATTRIBUTE 8
#define MAX_WORKSPACE 1

static int addmm(void) {
    cublasHandle_t blas = NULL;
    cublasStatus_t created = cublasCreate_v2(&blas);
    printf("create=%d", created);
    if (created != 0) return 1;
    cublasLtHandle_t lt = (cublasLtHandle_t)blas; /* PyTorch's cast */

    desc_t desc = UNREAD, a = UNREAD, b = UNREAD, c = UNREAD, preference = UNREAD;
    /* each call before the printf that shows its output: arguments are evaluated in no set order */
    cublasStatus_t made = cublasLtMatmulDescCreate(&desc, COMPUTE_32F, R_32F);
    printf(" desc_create=%d:%s", made, desc == NULL ? "null" : "set");
    int transpose = 1;
    printf(" desc_set=%d", cublasLtMatmulDescSetAttribute(desc, TRANSA, &transpose, sizeof transpose));
    printf(" desc_set_bias=%d", cublasLtMatmulDescSetAttribute(desc, EPILOGUE_BIAS_ATTRIBUTE, UNREAD, 8));
    int layouts = cublasLtMatrixLayoutCreate(&a, R_32F, 4, 3, 4);
    layouts = layouts * 100 + cublasLtMatrixLayoutCreate(&b, R_32F, 3, 2, 3);
    layouts = layouts * 100 + cublasLtMatrixLayoutCreate(&c, R_32F, 4, 2, 4);
    printf(" layouts=%d:%s", layouts, a == NULL && b == NULL && c == NULL ? "null" : "set");
    made = cublasLtMatmulPreferenceCreate(&preference);
    printf(" pref_create=%d:%s", made, preference == NULL ? "null" : "set");
    uint64_t workspace = 1 << 20;
    printf(" pref_set=%d", cublasLtMatmulPreferenceSetAttribute(preference, MAX_WORKSPACE, &workspace,
                                                                 sizeof workspace));
    heuristic_result results[2], untouched[2];
    memset(results, 0xab, sizeof results);
    memcpy(untouched, results, sizeof results);
    int returned = -1;
    /* with the descriptors the program would have had, had creation worked: addresses never read */
    cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(lt, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD, 1,
                                                              results, &returned);
    printf(" heuristic=%d:%d:%s", heuristic, returned, memcmp(results, untouched, sizeof results) ? "written" : "kept");
    heuristic = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, preference, 1, results, &returned);
    printf(" heuristic_again=%d", heuristic);
    printf(" matmul=%d", cublasLtMatmul(lt, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD, UNREAD,
                                        UNREAD, UNREAD, UNREAD, UNREAD, 1 << 20, NULL));
    /* PyTorch's deleters run on what creation left: NULL */
    printf(" destroys=%d%d%d%d", cublasLtMatrixLayoutDestroy(a), cublasLtMatrixLayoutDestroy(b),
           cublasLtMatmulPreferenceDestroy(preference), cublasLtMatmulDescDestroy(desc));
    printf(" destroy_foreign=%d", cublasLtMatmulDescDestroy(UNREAD));
    printf(" blas_destroy=%d\n", cublasDestroy_v2(blas)); /* gpupool's cuBLAS handle still works */
    return 0;
}

static int handles(void) {
    cublasHandle_t blas = NULL;
    cublasStatus_t created = cublasCreate_v2(&blas);
    int blas_version = -1;
    cublasGetVersion_v2(blas, &blas_version);
    printf("create=%d", created);
    cublasLtHandle_t one = NULL, two = NULL;
    int made = cublasLtCreate(&one) * 10;
    made += cublasLtCreate(&two);
    printf(" lt_create=%d", made);
    printf(" distinct=%d", one != NULL && two != NULL && one != two);
    printf(" lt_null=%d", cublasLtCreate(NULL));
    int destroyed = cublasLtDestroy(one) * 10;
    destroyed += cublasLtDestroy(two);
    printf(" lt_destroy=%d", destroyed);
    printf(" lt_destroy_again=%d", cublasLtDestroy(one));
    printf(" lt_destroy_blas=%d", cublasLtDestroy((cublasLtHandle_t)blas));
    printf(" lt_destroy_null=%d", cublasLtDestroy(NULL));
    printf(" version_same=%d", (int)cublasLtGetVersion() == blas_version && blas_version > 0);
    int major = -1;
    cublasStatus_t property = cublasLtGetProperty(0, &major);
    printf(" property=%d:%d", property, major == blas_version / 10000);
    printf(" cudart=%zu", cublasLtGetCudartVersion());
    printf(" name=%s", cublasLtGetStatusName(15));
    printf(" string=%s", strcmp(cublasLtGetStatusString(15), "the functionality requested is not supported") == 0
                             ? "ok" : cublasLtGetStatusString(15));
    printf(" blas_destroy=%d\n", cublasDestroy_v2(blas));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "addmm") == 0) return addmm();
    if (argc == 2 && strcmp(argv[1], "handles") == 0) return handles();
    fprintf(stderr, "usage: cublaslt_probe addmm | handles\n");
    return 2;
}
