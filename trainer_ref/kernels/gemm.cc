#include "trainer_ref/kernels/gemm.h"

#include <cublasLt.h>

#include "absl/strings/str_format.h"

namespace tierd::trainer::gpu {
namespace {

absl::Status Check(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const char* name = status == CUBLAS_STATUS_NOT_SUPPORTED      ? "not supported"
                     : status == CUBLAS_STATUS_INVALID_VALUE    ? "invalid value"
                     : status == CUBLAS_STATUS_ALLOC_FAILED     ? "allocation failed"
                     : status == CUBLAS_STATUS_EXECUTION_FAILED ? "execution failed"
                     : status == CUBLAS_STATUS_ARCH_MISMATCH    ? "architecture mismatch"
                     : status == CUBLAS_STATUS_NOT_INITIALIZED  ? "not initialized"
                                                                : "error";
  return absl::InternalError(absl::StrFormat("cuBLASLt %s: %s (status %d)", what, name, static_cast<int>(status)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("no CUDA device for the GEMMs");
  }
  std::unique_ptr<Gemm> gemm(new Gemm());
  cublasLtHandle_t handle = nullptr;
  if (absl::Status s = Check(cublasLtCreate(&handle), "create"); !s.ok()) return s;
  gemm->handle_ = handle;
  if (cudaMalloc(&gemm->workspace_, workspace_bytes) != cudaSuccess) {
    return absl::ResourceExhaustedError(absl::StrFormat("cannot allocate the %d-byte GEMM workspace", workspace_bytes));
  }
  gemm->workspace_bytes_ = workspace_bytes;
  return gemm;
}

Gemm::~Gemm() {
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::Status Gemm::Matmul(bool trans_a, bool trans_b, int m, int n, int k, const Bf16* a, int lda, const Bf16* b,
                          int ldb, void* d, bool d_fp32, int ldd, float beta, cudaStream_t stream) {
  if (m == 0 || n == 0 || k == 0) return absl::OkStatus();
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  auto cleanup = [&] {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  };
  absl::Status s = Check(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul desc");
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (s.ok()) s = Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa");
  if (s.ok()) s = Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb");
  // Stored shapes (column major): A is m x k (k x m when transposed), B k x n (n x k).
  if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, trans_a ? k : m, trans_a ? m : k, lda), "layout a");
  if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, trans_b ? n : k, trans_b ? k : n, ldb), "layout b");
  if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&ld, d_fp32 ? CUDA_R_32F : CUDA_R_16BF, m, n, ldd), "layout d");
  if (s.ok()) s = Check(cublasLtMatmulPreferenceCreate(&pref), "preference");
  if (s.ok()) {
    s = Check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                   sizeof(workspace_bytes_)),
              "workspace");
  }
  cublasLtMatmulHeuristicResult_t result = {};
  int found = 0;
  if (s.ok()) {
    s = Check(cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), desc, la, lb, ld, ld, pref, 1,
                                             &result, &found),
              "heuristic");
  }
  if (s.ok() && found == 0) {
    s = absl::InternalError(absl::StrFormat("cuBLASLt has no algorithm for %dx%dx%d bf16", m, n, k));
  }
  const float alpha = 1.f;
  if (s.ok()) {
    s = Check(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                             &result.algo, workspace_, workspace_bytes_, stream),
              "matmul");
  }
  cleanup();
  return s;
}

absl::Status Gemm::Forward(Bf16* out, const Bf16* in, const Bf16* weight, int n, int ic, int oc, cudaStream_t stream,
                           bool accumulate) {
  // Row-major out (N, OC) is column-major out^T (OC x N) = weight (OC x IC) x in^T: weight is
  // stored row major, i.e. column-major IC x OC, so it goes transposed.
  return Matmul(/*trans_a=*/true, /*trans_b=*/false, oc, n, ic, weight, ic, in, ic, out, /*d_fp32=*/false, oc,
                accumulate ? 1.f : 0.f, stream);
}

absl::Status Gemm::Backward(Bf16* din, float* dweight, const Bf16* dout, const Bf16* in, const Bf16* weight, int n,
                            int ic, int oc, cudaStream_t stream) {
  if (din != nullptr) {
    // din^T (IC x N) += weight^T (IC x OC, stored so) x dout^T (OC x N, stored so).
    if (absl::Status s = Matmul(false, false, ic, n, oc, weight, ic, dout, oc, din, false, ic, 1.f, stream); !s.ok()) return s;
  }
  if (dweight != nullptr) {
    // dweight^T (IC x OC) += in^T (IC x N, stored so) x dout (N x OC: dout^T stored, transposed).
    if (absl::Status s = Matmul(false, true, ic, oc, n, in, ic, dout, oc, dweight, true, ic, 1.f, stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
