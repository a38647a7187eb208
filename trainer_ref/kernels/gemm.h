// The reference trainer's matmuls on the GPU through cuBLASLt: bf16 in and out, fp32
// accumulation, the shapes of cpu::MatmulForward/Backward (nn.Linear without bias, row
// major). One Gemm per device and thread; it owns a cuBLASLt handle and a workspace.
// Each distinct call shape (types, transposes, m, n, k, leading dimensions, output type) gets
// a plan the first time it is seen — its descriptors and an algorithm — kept for the Gemm's
// life, so later calls only set the scale pointers and launch. The algorithm is cuBLASLt's
// heuristic first choice, or (GemmOptions::candidates > 1) the fastest of its first few,
// timed on the call's own inputs into a scratch output. Searched choices are kept in a cache
// file for the GPU and cuBLASLt version (GemmOptions::cache_dir), so the next process — a
// resumed run above all — takes the same algorithms, and the same bits, without timing.
#ifndef TIERD_TRAINER_REF_KERNELS_GEMM_H_
#define TIERD_TRAINER_REF_KERNELS_GEMM_H_

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

struct GemmOptions {
  size_t workspace_bytes = size_t{32} << 20;
  // How many of cuBLASLt's heuristic candidates a new shape's first call times (3 runs each,
  // after one to warm up) to keep the fastest; 1: the heuristic's first, untimed.
  int candidates = 1;
  // Where searched choices are read from and appended to: a file per GPU model, cuBLASLt
  // version and candidate count ("" keeps them in memory only).
  std::string cache_dir;
  // false: only algorithms that reduce no split of K across blocks through the workspace
  // (cuBLASLt's CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK at none), for timing what those
  // reductions and the workspace zeroing they bring cost a step (fp8_gemm_bench).
  bool split_k_reductions = true;
};

class Gemm {
 public:
  // FAILED_PRECONDITION without a usable CUDA device or cuBLASLt.
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(size_t workspace_bytes = size_t{32} << 20);
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(const GemmOptions& options);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out (N, OC) = in (N, IC) x weight^T, weight (OC, IC); `accumulate`: out += instead.
  absl::Status Forward(Bf16* out, const Bf16* in, const Bf16* weight, int n, int ic, int oc, cudaStream_t stream,
                       bool accumulate = false);
  // din (N, IC, bf16) += dout x weight (`accumulate_din` false: din = ..., the first
  // contribution, so din need not be zeroed); dweight (OC, IC, fp32: gradients accumulate over
  // micro-batches without bf16 rounding) += dout^T x in (`accumulate_dweight` false: =, the
  // step's first, so the gradients need no zeroing and are not read). Either may be null.
  absl::Status Backward(Bf16* din, float* dweight, const Bf16* dout, const Bf16* in, const Bf16* weight, int n, int ic,
                        int oc, cudaStream_t stream, bool accumulate_din = true, bool accumulate_dweight = true);
  // Forward from FP8 codes (QuantizeFp8): out (N, OC, bf16) = (in_scale_inv * in) x
  // (weight_scale_inv * weight)^T, in and weight E4M3 (or E5M2 with e5m2_in: a gradient),
  // the scale_invs device floats each in its own 16-byte-aligned slot (cuBLASLt refuses an
  // FP8 matmul otherwise), fp32 accumulation (`fast_accumulation`: the tensor cores' faster,
  // less exact one, as Transformer Engine's forward). IC and OC multiples of 16.
  absl::Status ForwardFp8(Bf16* out, const uint8_t* in, const uint8_t* weight, const float* in_scale_inv,
                          const float* weight_scale_inv, int n, int ic, int oc, cudaStream_t stream,
                          bool fast_accumulation = false, bool e5m2_in = false);
  // Backward from FP8 codes, as Backward: din (N, IC, bf16) += dout x weight and dweight
  // (OC, IC, fp32) += dout^T x in, either may be null. The gradient in E5M2, the weight and
  // input in E4M3, each transposed where the tensor cores want it (QuantizeFp8Transposed):
  // weight_t (IC, OC), in_t (IC, N), dout (N, OC) and dout_t (OC, N). Each scale_inv in its
  // own 16-byte slot; N, IC and OC multiples of 16.
  absl::Status BackwardFp8(Bf16* din, float* dweight, const uint8_t* dout, const uint8_t* dout_t, const uint8_t* in_t,
                           const uint8_t* weight_t, const float* dout_scale_inv, const float* in_scale_inv,
                           const float* weight_scale_inv, int n, int ic, int oc, cudaStream_t stream,
                           bool accumulate_din = true, bool accumulate_dweight = true);

  // Each planned shape in words: m x n x k, types, candidates timed and the gain over the
  // heuristic's first choice (for a benchmark's report).
  std::vector<std::string> DescribePlans() const;
  size_t plans() const { return plans_.size(); }

 private:
  Gemm() = default;
  // Column-major D (m x n) = alpha op(A) op(B) + beta D: A, B bf16, fp32 compute, D bf16
  // or (d_fp32) fp32.
  absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, const Bf16* a, int lda, const Bf16* b, int ldb,
                      void* d, bool d_fp32, int ldd, float beta, cudaStream_t stream);
  // A and B of other types (FP8), with their dequantising scales.
  struct Inputs {
    int a_type = 0, b_type = 0;  // cudaDataType
    const float* a_scale = nullptr;
    const float* b_scale = nullptr;
    bool fast_accumulation = false;
  };
  absl::Status MatmulOf(const Inputs& inputs, bool trans_a, bool trans_b, int m, int n, int k, const void* a, int lda,
                        const void* b, int ldb, void* d, bool d_fp32, int ldd, float beta, cudaStream_t stream);

  // A call's shape, and what it was planned with.
  using Key = std::array<int, 14>;
  struct Plan {
    void* desc = nullptr;  // cublasLtMatmulDesc_t
    void* layouts[3] = {};  // cublasLtMatrixLayout_t: A, B, D
    std::array<uint64_t, 8> algo{};  // cublasLtMatmulAlgo_t's bytes
    int tried = 0;                   // candidates timed (0: the heuristic's first, untimed)
    bool cached = false;             // the algorithm came from the cache file
    float best_ms = 0, first_ms = 0; // the chosen one's time and the heuristic first's, when timed
  };
  absl::StatusOr<Plan*> PlanFor(const Key& key, const Inputs& inputs, bool trans_a, bool trans_b, int m, int n, int k,
                                const void* a, int lda, const void* b, int ldb, bool d_fp32, int ldd, float beta,
                                cudaStream_t stream);
  // Times each candidate into a scratch output (the call's own is left as it is) and keeps
  // the fastest in plan.algo.
  absl::Status Search(Plan& plan, const std::vector<std::array<uint64_t, 8>>& algos, int n, const void* a,
                      const void* b, bool d_fp32, int ldd, float beta, cudaStream_t stream);

  void* handle_ = nullptr;  // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool split_k_reductions_ = true;
  int candidates_ = 1;
  std::map<Key, Plan> plans_;
  std::string cache_file_;                          // "" without a cache
  std::map<Key, std::array<uint64_t, 8>> cached_;  // the file's choices, by shape
  int cache_lines_skipped_ = 0;                     // lines of the file that did not parse
  void ReadCache();
  void AppendToCache(const Key& key, const Plan& plan);

 public:
  const std::string& cache_file() const { return cache_file_; }
  // Shapes whose algorithm came from the cache file, and lines of it that did not parse.
  int cache_hits() const { return cache_hits_; }
  int cache_lines_skipped() const { return cache_lines_skipped_; }

 private:
  int cache_hits_ = 0;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GEMM_H_
