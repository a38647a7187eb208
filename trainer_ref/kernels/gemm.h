// The reference trainer's matmuls on the GPU through cuBLASLt: bf16 in and out, fp32
// accumulation, the shapes of cpu::MatmulForward/Backward (nn.Linear without bias, row
// major). One Gemm per device and thread; it owns a cuBLASLt handle and a workspace.
#ifndef TIERD_TRAINER_REF_KERNELS_GEMM_H_
#define TIERD_TRAINER_REF_KERNELS_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

class Gemm {
 public:
  // FAILED_PRECONDITION without a usable CUDA device or cuBLASLt.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(size_t workspace_bytes = size_t{32} << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out (N, OC) = in (N, IC) x weight^T, weight (OC, IC); `accumulate`: out += instead.
  absl::Status Forward(Bf16* out, const Bf16* in, const Bf16* weight, int n, int ic, int oc, cudaStream_t stream,
                       bool accumulate = false);
  // din (N, IC, bf16) += dout x weight; dweight (OC, IC, fp32: gradients accumulate over
  // micro-batches without bf16 rounding) += dout^T x in. Either may be null.
  absl::Status Backward(Bf16* din, float* dweight, const Bf16* dout, const Bf16* in, const Bf16* weight, int n, int ic,
                        int oc, cudaStream_t stream);

 private:
  Gemm() = default;
  // Column-major D (m x n) = alpha op(A) op(B) + beta D: A, B bf16, fp32 compute, D bf16
  // or (d_fp32) fp32.
  absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, const Bf16* a, int lda, const Bf16* b, int ldb,
                      void* d, bool d_fp32, int ldd, float beta, cudaStream_t stream);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GEMM_H_
