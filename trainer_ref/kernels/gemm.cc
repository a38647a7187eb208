#include "trainer_ref/kernels/gemm.h"

#include <cublasLt.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

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

#define RETURN_IF_CUBLAS(expr, what)                                 \
  do {                                                               \
    if (absl::Status _s = Check((expr), (what)); !_s.ok()) return _s; \
  } while (0)

}  // namespace

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(size_t workspace_bytes) {
  GemmOptions options;
  options.workspace_bytes = workspace_bytes;
  return Create(options);
}

absl::StatusOr<std::unique_ptr<Gemm>> Gemm::Create(const GemmOptions& options) {
  if (options.candidates < 1 || options.candidates > 64) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d GEMM candidates to time: give 1 (the heuristic's first) up to 64", options.candidates));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError("no CUDA device for the GEMMs");
  }
  std::unique_ptr<Gemm> gemm(new Gemm());
  gemm->candidates_ = options.candidates;
  cublasLtHandle_t handle = nullptr;
  if (absl::Status s = Check(cublasLtCreate(&handle), "create"); !s.ok()) return s;
  gemm->handle_ = handle;
  if (cudaMalloc(&gemm->workspace_, options.workspace_bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrFormat("cannot allocate the %d-byte GEMM workspace", options.workspace_bytes));
  }
  gemm->workspace_bytes_ = options.workspace_bytes;
  gemm->split_k_reductions_ = options.split_k_reductions;
  if (!options.cache_dir.empty() && options.candidates > 1) {
    cudaDeviceProp prop{};
    int device = 0;
    cudaGetDevice(&device);
    cudaGetDeviceProperties(&prop, device);
    std::string gpu = prop.name;
    for (char& ch : gpu) {
      if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '-';
    }
    // Choices made without split-K reductions are not the full search's: a file of their own.
    gemm->cache_file_ = absl::StrFormat("%s/gemm-%s-cublaslt%d-best-of-%d%s.txt", options.cache_dir, gpu,
                                        static_cast<int>(cublasLtGetVersion()), options.candidates,
                                        options.split_k_reductions ? "" : "-no-split-k");
    gemm->ReadCache();
  }
  return gemm;
}

// One line a shape: its 14 key numbers, then the algorithm's 8 words in hex.
void Gemm::ReadCache() {
  std::ifstream file(cache_file_);
  std::string line;
  while (std::getline(file, line)) {
    std::istringstream words(line);
    Key key;
    std::array<uint64_t, 8> algo;
    bool ok = true;
    for (int& k : key) ok = ok && static_cast<bool>(words >> k);
    for (uint64_t& a : algo) ok = ok && static_cast<bool>(words >> std::hex >> a);
    std::string rest;
    if (!ok || (words >> rest)) {
      ++cache_lines_skipped_;
      continue;
    }
    cached_[key] = algo;
  }
}

void Gemm::AppendToCache(const Key& key, const Plan& plan) {
  if (cache_file_.empty()) return;
  std::string line;
  for (int k : key) line += absl::StrFormat("%d ", k);
  for (int i = 0; i < 8; ++i) line += absl::StrFormat(i < 7 ? "%x " : "%x\n", plan.algo[i]);
  // One write of a whole line, appended: processes sharing the file interleave whole lines.
  mkdir(cache_file_.substr(0, cache_file_.rfind('/')).c_str(), 0755);
  const int fd = open(cache_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;  // a cache that cannot be written costs a search next time, nothing else
  const ssize_t written = write(fd, line.data(), line.size());
  (void)written;
  close(fd);
}

namespace {

void DestroyPlanObjects(void* desc, void* const layouts[3]) {
  for (int i = 0; i < 3; ++i) {
    if (layouts[i] != nullptr) cublasLtMatrixLayoutDestroy(static_cast<cublasLtMatrixLayout_t>(layouts[i]));
  }
  if (desc != nullptr) cublasLtMatmulDescDestroy(static_cast<cublasLtMatmulDesc_t>(desc));
}

const char* TypeName(int type) {
  return type == CUDA_R_16BF ? "bf16" : type == CUDA_R_8F_E4M3 ? "e4m3" : type == CUDA_R_8F_E5M2 ? "e5m2" : "?";
}

}  // namespace

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_) DestroyPlanObjects(plan.desc, plan.layouts);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (handle_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::Status Gemm::Matmul(bool trans_a, bool trans_b, int m, int n, int k, const Bf16* a, int lda, const Bf16* b,
                          int ldb, void* d, bool d_fp32, int ldd, float beta, cudaStream_t stream) {
  return MatmulOf({CUDA_R_16BF, CUDA_R_16BF}, trans_a, trans_b, m, n, k, a, lda, b, ldb, d, d_fp32, ldd, beta, stream);
}

absl::StatusOr<Gemm::Plan*> Gemm::PlanFor(const Key& key, const Inputs& inputs, bool trans_a, bool trans_b, int m,
                                          int n, int k, const void* a, int lda, const void* b, int ldb, bool d_fp32,
                                          int ldd, float beta, cudaStream_t stream) {
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  const auto a_type = static_cast<cudaDataType_t>(inputs.a_type), b_type = static_cast<cudaDataType_t>(inputs.b_type);
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
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
  if (s.ok() && !split_k_reductions_) {
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    s = Check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof(none)),
              "reduction schemes");
  }
  std::vector<cublasLtMatmulHeuristicResult_t> results(candidates_);
  int found = 0;
  if (s.ok()) {
    s = Check(cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), desc, la, lb, ld, ld, pref,
                                             candidates_, results.data(), &found),
              "heuristic");
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (s.ok() && found == 0) {
    s = absl::InternalError(absl::StrFormat("cuBLASLt has no algorithm for %dx%dx%d %s x %s", m, n, k,
                                            TypeName(inputs.a_type), TypeName(inputs.b_type)));
  }
  Plan plan;
  plan.desc = desc;
  plan.layouts[0] = la;
  plan.layouts[1] = lb;
  plan.layouts[2] = ld;
  if (!s.ok()) {
    DestroyPlanObjects(plan.desc, plan.layouts);
    return s;
  }
  std::vector<std::array<uint64_t, 8>> algos(found);
  static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(std::array<uint64_t, 8>));
  for (int i = 0; i < found; ++i) std::memcpy(algos[i].data(), &results[i].algo, sizeof(cublasLtMatmulAlgo_t));
  plan.algo = algos[0];
  // A choice from the cache file, if cuBLASLt still takes it for this shape.
  bool from_cache = false;
  if (auto hit = cached_.find(key); hit != cached_.end()) {
    cublasLtMatmulAlgo_t algo;
    std::memcpy(&algo, hit->second.data(), sizeof(algo));
    cublasLtMatmulHeuristicResult_t check = {};
    if (cublasLtMatmulAlgoCheck(static_cast<cublasLtHandle_t>(handle_), desc, la, lb, ld, ld, &algo, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= workspace_bytes_) {
      plan.algo = hit->second;
      plan.cached = from_cache = true;
      ++cache_hits_;
    }
  }
  if (found > 1 && !from_cache) {
    if (absl::Status searched = Search(plan, algos, n, a, b, d_fp32, ldd, beta, stream); !searched.ok()) {
      DestroyPlanObjects(plan.desc, plan.layouts);
      return searched;
    }
    if (plan.tried > 0) AppendToCache(key, plan);
  }
  auto [it, inserted] = plans_.emplace(key, plan);
  return &it->second;
}

absl::Status Gemm::Search(Plan& plan, const std::vector<std::array<uint64_t, 8>>& algos, int n, const void* a,
                          const void* b, bool d_fp32, int ldd, float beta, cudaStream_t stream) {
  // A scratch output, so that timing the candidates leaves the call's own (accumulated) one
  // as it was; without room for it the heuristic's first stays, untimed.
  const size_t bytes = static_cast<size_t>(ldd) * n * (d_fp32 ? 4 : 2);
  void* scratch = nullptr;
  if (cudaMalloc(&scratch, bytes) != cudaSuccess) {
    cudaGetLastError();
    return absl::OkStatus();
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaMemsetAsync(scratch, 0, bytes, stream);
  const float alpha = 1.f;
  auto run = [&](const std::array<uint64_t, 8>& algo) {
    cublasLtMatmulAlgo_t chosen;
    std::memcpy(&chosen, algo.data(), sizeof(chosen));
    return cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), static_cast<cublasLtMatmulDesc_t>(plan.desc),
                          &alpha, a, static_cast<cublasLtMatrixLayout_t>(plan.layouts[0]), b,
                          static_cast<cublasLtMatrixLayout_t>(plan.layouts[1]), &beta, scratch,
                          static_cast<cublasLtMatrixLayout_t>(plan.layouts[2]), scratch,
                          static_cast<cublasLtMatrixLayout_t>(plan.layouts[2]), &chosen, workspace_, workspace_bytes_,
                          stream);
  };
  float best = -1;
  for (size_t i = 0; i < algos.size(); ++i) {
    if (run(algos[i]) != CUBLAS_STATUS_SUCCESS) continue;  // a candidate that cannot run here is passed over
    constexpr int kRuns = 3;
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int r = 0; r < kRuns; ++r) ok &= run(algos[i]) == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(stop, stream);
    if (cudaEventSynchronize(stop) != cudaSuccess || !ok) continue;
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    ms /= kRuns;
    ++plan.tried;
    if (i == 0) plan.first_ms = ms;
    if (best < 0 || ms < best) {
      best = ms;
      plan.algo = algos[i];
    }
  }
  plan.best_ms = best > 0 ? best : 0;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(scratch);
  return absl::OkStatus();
}

absl::Status Gemm::MatmulOf(const Inputs& inputs, bool trans_a, bool trans_b, int m, int n, int k, const void* a,
                            int lda, const void* b, int ldb, void* d, bool d_fp32, int ldd, float beta,
                            cudaStream_t stream) {
  if (m == 0 || n == 0 || k == 0) return absl::OkStatus();
  // cuBLASLt fails an FP8 matmul whose scale is not 16-byte aligned, with a status that does
  // not say why: refused here, naming the address.
  for (const auto& [scale, which] : {std::pair{inputs.a_scale, "A"}, std::pair{inputs.b_scale, "B"}}) {
    if (reinterpret_cast<uintptr_t>(scale) % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "an FP8 matmul's %s scale at %p is not 16-byte aligned (cuBLASLt reads a scale only from such an address)",
          which, static_cast<const void*>(scale)));
    }
  }
  const Key key{inputs.a_type,
                inputs.b_type,
                trans_a,
                trans_b,
                m,
                n,
                k,
                lda,
                ldb,
                ldd,
                d_fp32,
                inputs.fast_accumulation,
                inputs.a_scale != nullptr,
                inputs.b_scale != nullptr};
  auto plan = PlanFor(key, inputs, trans_a, trans_b, m, n, k, a, lda, b, ldb, d_fp32, ldd, beta, stream);
  if (!plan.ok()) return plan.status();
  auto desc = static_cast<cublasLtMatmulDesc_t>((*plan)->desc);
  // The scales' pointers differ from call to call (a tensor's own slot).
  if (inputs.a_scale != nullptr) {
    RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &inputs.a_scale,
                                                    sizeof(inputs.a_scale)),
                     "a scale");
  }
  if (inputs.b_scale != nullptr) {
    RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &inputs.b_scale,
                                                    sizeof(inputs.b_scale)),
                     "b scale");
  }
  cublasLtMatmulAlgo_t algo;
  std::memcpy(&algo, (*plan)->algo.data(), sizeof(algo));
  const float alpha = 1.f;
  auto layout = [&](int i) { return static_cast<cublasLtMatrixLayout_t>((*plan)->layouts[i]); };
  return Check(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), desc, &alpha, a, layout(0), b, layout(1), &beta, d,
                              layout(2), d, layout(2), &algo, workspace_, workspace_bytes_, stream),
               "matmul");
}

std::vector<std::string> Gemm::DescribePlans() const {
  std::vector<std::string> out;
  for (const auto& [key, plan] : plans_) {
    std::string line =
        absl::StrFormat("m %d n %d k %d, %s x %s -> %s%s", key[4], key[5], key[6], TypeName(key[0]), TypeName(key[1]),
                        key[10] ? "fp32" : "bf16", key[11] ? " (fast accumulation)" : "");
    if (plan.cached) {
      line += ": from the cache file";
    } else if (plan.tried > 1 && plan.best_ms > 0) {
      line += absl::StrFormat(": %d candidates timed, the fastest %.3f ms, the heuristic's first %.3f ms (%.2fx)",
                              plan.tried, plan.best_ms, plan.first_ms, plan.first_ms / plan.best_ms);
    } else {
      line += ": the heuristic's first";
    }
    out.push_back(line);
  }
  return out;
}

absl::Status Gemm::Forward(Bf16* out, const Bf16* in, const Bf16* weight, int n, int ic, int oc, cudaStream_t stream,
                           bool accumulate) {
  // Row-major out (N, OC) is column-major out^T (OC x N) = weight (OC x IC) x in^T: weight is
  // stored row major, i.e. column-major IC x OC, so it goes transposed.
  return Matmul(/*trans_a=*/true, /*trans_b=*/false, oc, n, ic, weight, ic, in, ic, out, /*d_fp32=*/false, oc,
                accumulate ? 1.f : 0.f, stream);
}

absl::Status Gemm::Backward(Bf16* din, float* dweight, const Bf16* dout, const Bf16* in, const Bf16* weight, int n,
                            int ic, int oc, cudaStream_t stream, bool accumulate_din, bool accumulate_dweight) {
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
    if (absl::Status s = Matmul(false, true, ic, oc, n, in, ic, dout, oc, dweight, true, ic,
                                accumulate_dweight ? 1.f : 0.f, stream);
        !s.ok()) {
      return s;
    }
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
                               cudaStream_t stream, bool accumulate_din, bool accumulate_dweight) {
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
    if (absl::Status s = MatmulOf(inputs, true, false, ic, oc, n, in_t, n, dout_t, n, dweight, true, ic,
                                  accumulate_dweight ? 1.f : 0.f, stream);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
