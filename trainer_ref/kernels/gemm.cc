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
  return MatmulOf({CUDA_R_16BF, CUDA_R_16BF}, trans_a, trans_b, m, n, k, a, lda, b, ldb, d, d_fp32, ldd, beta, stream);
}

absl::Status Gemm::MatmulOf(const Inputs& inputs, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                            int lda, const void* b, int ldb, void* d, bool d_fp32, int ldd, float beta,
                            cudaStream_t stream) {
  if (m == 0 || n == 0 || k == 0) return absl::OkStatus();
  const auto a_type = static_cast<cudaDataType_t>(inputs.a_type), b_type = static_cast<cudaDataType_t>(inputs.b_type);
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
  if (s.ok() && inputs.a_scale != nullptr) {
    s = Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &inputs.a_scale,
                                             sizeof(inputs.a_scale)),
              "a scale");
  }
  if (s.ok() && inputs.b_scale != nullptr) {
    s = Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &inputs.b_scale,
                                             sizeof(inputs.b_scale)),
              "b scale");
  }
  if (s.ok() && inputs.fast_accumulation) {
    const int8_t fast = 1;
    s = Check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)), "fast accum");
  }
  // Stored shapes (column major): A is m x k (k x m when transposed), B k x n (n x k).
  if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&la, a_type, trans_a ? k : m, trans_a ? m : k, lda), "layout a");
  if (s.ok()) s = Check(cublasLtMatrixLayoutCreate(&lb, b_type, trans_b ? n : k, trans_b ? k : n, ldb), "layout b");
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
    s = absl::InternalError(
        absl::StrFormat("cuBLASLt has no algorithm for %dx%dx%d %s", m, n, k, a_type == CUDA_R_16BF ? "bf16" : "fp8"));
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
                            int ic, int oc, cudaStream_t stream, bool accumulate_din) {
  if (din != nullptr) {
    // din^T (IC x N) += weight^T (IC x OC, stored so) x dout^T (OC x N, stored so).
    if (absl::Status s =
            Matmul(false, false, ic, n, oc, weight, ic, dout, oc, din, false, ic, accumulate_din ? 1.f : 0.f, stream);
        !s.ok()) {
      return s;
    }
  }
  if (dweight != nullptr) {
    // dweight^T (IC x OC) += in^T (IC x N, stored so) x dout (N x OC: dout^T stored, transposed).
    if (absl::Status s = Matmul(false, true, ic, oc, n, in, ic, dout, oc, dweight, true, ic, 1.f, stream); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Gemm::ForwardFp8(Bf16* out, const uint8_t* in, const uint8_t* weight, const float* in_scale_inv,
                              const float* weight_scale_inv, int n, int ic, int oc, cudaStream_t stream,
                              bool fast_accumulation, bool e5m2_in) {
  if (ic % 16 != 0 || oc % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("an FP8 matmul needs IC and OC multiples of 16, not %d and %d", ic, oc));
  }
  // As Forward: column-major out^T (OC x N) = weight (stored IC x OC, transposed) x in^T; the
  // transposed-A, plain-B form is the one FP8 tensor cores take.
  Inputs inputs{CUDA_R_8F_E4M3, e5m2_in ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3, weight_scale_inv, in_scale_inv,
                fast_accumulation};
  return MatmulOf(inputs, /*trans_a=*/true, /*trans_b=*/false, oc, n, ic, weight, ic, in, ic, out, /*d_fp32=*/false, oc,
                  0.f, stream);
}

absl::Status Gemm::BackwardFp8(Bf16* din, float* dweight, const uint8_t* dout, const uint8_t* dout_t,
                               const uint8_t* in_t, const uint8_t* weight_t, const float* dout_scale_inv,
                               const float* in_scale_inv, const float* weight_scale_inv, int n, int ic, int oc,
                               cudaStream_t stream, bool accumulate_din) {
  if (n % 16 != 0 || ic % 16 != 0 || oc % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("an FP8 matmul needs N, IC and OC multiples of 16, not %d, %d and %d", n, ic, oc));
  }
  if (din != nullptr) {
    // din^T (IC x N) += weight^T x dout^T: A = weight_t read transposed (stored OC x IC column
    // major), B = dout (stored OC x N column major).
    Inputs inputs{CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, weight_scale_inv, dout_scale_inv};
    if (absl::Status s = MatmulOf(inputs, true, false, ic, n, oc, weight_t, oc, dout, oc, din, false, ic,
                                  accumulate_din ? 1.f : 0.f, stream);
        !s.ok()) {
      return s;
    }
  }
  if (dweight != nullptr) {
    // dweight^T (IC x OC) += in^T x dout: A = in_t read transposed (stored N x IC column
    // major), B = dout_t (stored N x OC column major); fp32 out.
    Inputs inputs{CUDA_R_8F_E4M3, CUDA_R_8F_E5M2, in_scale_inv, dout_scale_inv};
    if (absl::Status s = MatmulOf(inputs, true, false, ic, oc, n, in_t, n, dout_t, n, dweight, true, ic, 1.f, stream);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
