// Causal attention's backward on tensor cores (the forward and the overview: attention_tc.cu):
// delta_i = dO_i . O_i; then per 64-key tile dK, dV (looping over the query steps at or after
// it), writing each step's dS (bf16) into the scratch; then per 128-query tile dQ = dS K
// (looping over the key tiles at or before it). Every gradient row is summed in one block, in
// a fixed order (deterministic, no atomics), and S and dP are computed once, at the price of
// dS's round trip through memory (the causal half, bf16: 132 MiB for 2 x 2048 x 16 heads).
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "trainer_ref/kernels/attention_tc.h"
#include "trainer_ref/kernels/attention_tc_tiles.cuh"

namespace tierd::trainer::gpu {
namespace attention_tc {
namespace {

// delta (B, H, T) = rowsum(dO * O), one warp per row.
__global__ void DeltaKernel(float* delta, const Bf16* dout, const Bf16* out, int b, int t, int h, int d) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{b} * h * t) return;
  const int ti = static_cast<int>(row % t), head = static_cast<int>((row / t) % h),
            bi = static_cast<int>(row / (int64_t{t} * h));
  const int64_t at = RowOf(bi, ti, head, t, h, d);
  float sum = 0.f;
  for (int i = lane; i < d; i += 32) {
    sum += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(dout)[at + i]) *
           __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(out)[at + i]);
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) delta[(int64_t{bi} * h + head) * t + ti] = sum;
}

// dS^T, written by the key kernel for the dQ kernel, bf16: per (batch, head), for each 64-key
// tile kt, its 64 key rows over the queries from 64 kt to Tp (T rounded up to 64), row-major.
__host__ __device__ constexpr int64_t DsHeadElems(int t) {
  const int64_t tiles = (t + kTile - 1) / kTile;
  return int64_t{kTile} * kTile * tiles * (tiles + 1) / 2;
}
__device__ __forceinline__ int64_t DsTileBase(int kt, int tp) {
  return int64_t{kTile} * (int64_t{kt} * tp - int64_t{kTile} * kt * (kt - 1) / 2);
}
__device__ __forceinline__ int DsRowLength(int kt, int tp) { return tp - kTile * kt; }
__device__ __forceinline__ int PaddedT(int t) { return (t + kTile - 1) / kTile * kTile; }

// The key kernel takes queries `Step` at a time: with D = 128 a 32-query step keeps its
// registers (dK, dV, S^T, dP^T) under the limit without spilling.
template <int D>
constexpr int kKeyStep = D == 128 ? 32 : 64;

template <int D>
struct KeySmem {
  __nv_bfloat16 k[kTile * kLd<D>], v[kTile * kLd<D>];
  __nv_bfloat16 q[2][kKeyStep<D> * kLd<D>], dout[2][kKeyStep<D> * kLd<D>];
  float lse[2][kKeyStep<D>], delta[2][kKeyStep<D>];
};

// dK, dV for 64 keys: over the query steps at or after them; and, when `ds` is given, each
// step's dS^T (bf16, unscaled) for the dQ kernel, which then needs no S or dP of its own.
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    KeyKernel(Bf16* dk, Bf16* dv, Bf16* ds, const Bf16* dout, const float* lse, const float* delta, const Bf16* q,
              const Bf16* k, const Bf16* v, int t, int h, float scale) {
  constexpr int kStep = kKeyStep<D>;
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<KeySmem<D>*>(raw);
  const int kt = blockIdx.x, k0 = kt * kTile, head = blockIdx.y, bi = blockIdx.z;  // block 0 has the most work
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t stats = (int64_t{bi} * h + head) * t;
  const float scale2 = scale * kLog2e;
  const int tp = PaddedT(t), ds_ld = DsRowLength(kt, tp);
  // This thread's dS^T rows (keys key0 and key0 + 8), at the column of query k0.
  __nv_bfloat16* ds_rows = ds == nullptr
                               ? nullptr
                               : reinterpret_cast<__nv_bfloat16*>(ds) + (int64_t{bi} * h + head) * DsHeadElems(t) +
                                     DsTileBase(kt, tp) + int64_t{warp * 16 + g} * ds_ld;
  auto load_step = [&](int buf, int first) {
    LoadRows<D, kStep>(sm.q[buf], q, bi, first, head, t, h);
    LoadRows<D, kStep>(sm.dout[buf], dout, bi, first, head, t, h);
    LoadFloats(sm.lse[buf], lse, stats, first, kStep, t);
    LoadFloats(sm.delta[buf], delta, stats, first, kStep, t);
  };
  LoadRows<D, kTile>(sm.k, k, bi, k0, head, t, h);
  LoadRows<D, kTile>(sm.v, v, bi, k0, head, t, h);
  load_step(0, k0);
  CpAsyncCommit();
  float dk_acc[D / 8][4] = {}, dv_acc[D / 8][4] = {};
  const int key0 = k0 + warp * 16 + g;  // and key0 + 8
  const int steps = (t - k0 + kStep - 1) / kStep;
  for (int i = 0; i < steps; ++i) {
    const int q_first = k0 + i * kStep, buf = i % 2;
    NextTileThenWait(i + 1 < steps, [&] { load_step(buf ^ 1, q_first + kStep); });
    // S^T (16 keys x kStep queries) = K_w Q^T, then P^T = exp(S^T scale - lse) where
    // query >= key (in place).
    float s[kStep / 8][4] = {};
    RowsTimesRowsT<D, kStep>(s, sm.k + warp * 16 * kLd<D>, sm.q[buf]);
#pragma unroll
    for (int nt = 0; nt < kStep / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * c + (e & 1), query = q_first + col, key = key0 + (e >= 2 ? 8 : 0);
        s[nt][e] = query >= key && query < t ? exp2f(s[nt][e] * scale2 - sm.lse[buf][col] * kLog2e) : 0.f;
      }
    }
    RegsTimesRows<D, kStep>(dv_acc, s, sm.dout[buf]);  // dV_w += P^T dO
    // dP^T = V_w dO^T; dS^T = P^T (dP^T - delta) into s.
    float dp[kStep / 8][4] = {};
    RowsTimesRowsT<D, kStep>(dp, sm.v + warp * 16 * kLd<D>, sm.dout[buf]);
#pragma unroll
    for (int nt = 0; nt < kStep / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - sm.delta[buf][nt * 8 + 2 * c + (e & 1)];
    }
    if (ds_rows != nullptr) {  // the bf16 the dQ kernel's MMAs read (the same rounding as CToA's)
#pragma unroll
      for (int nt = 0; nt < kStep / 8; ++nt) {
        const int col = q_first - k0 + nt * 8 + 2 * c;
        *reinterpret_cast<uint32_t*>(ds_rows + col) = Pack(s[nt][0], s[nt][1]);
        *reinterpret_cast<uint32_t*>(ds_rows + 8 * ds_ld + col) = Pack(s[nt][2], s[nt][3]);
      }
    }
    RegsTimesRows<D, kStep>(dk_acc, s, sm.q[buf]);  // dK_w += dS^T Q (scaled at the end)
    __syncthreads();
  }
  StoreRowsToGlobal<D>(dk, dk_acc, scale, bi, k0 + warp * 16, head, t, h);
  StoreRowsToGlobal<D>(dv, dv_acc, 1.f, bi, k0 + warp * 16, head, t, h);
}

// The A fragment of rows 0..15, columns 0..15 of M^T, M (16 x 16) row-major at `p`: the
// transposing load of M's four 8 x 8 blocks.
__device__ __forceinline__ void LoadATrans(uint32_t a[4], const __nv_bfloat16* p, int ld) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4Trans(a, p + ((lane / 16) * 8 + lane % 8) * ld + ((lane / 8) % 2) * 8);
}

// The dQ kernel's warps take two 16-row query tiles each (128 queries a block): dQ's
// accumulators are all it keeps in registers, and each K fragment feeds two MMAs.
constexpr int kDsTiles = 2;
constexpr int kDsRows = kWarps * 16 * kDsTiles;
constexpr int kDsLd = kDsRows + 8;

template <int D>
struct DsQuerySmem {
  __nv_bfloat16 ds[2][kTile * kDsLd];  // dS^T: 64 keys x 128 queries
  __nv_bfloat16 k[2][kTile * kLd<D>];
};

// dQ = dS K for 128 queries, over the key tiles at or before them, dS^T from the key kernel.
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    QueryFromDsKernel(Bf16* dq, const Bf16* ds, const Bf16* k, int t, int h, float scale) {
  constexpr int M = kDsTiles;
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<DsQuerySmem<D>*>(raw);
  const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int q0 = qb * kDsRows, head = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int warp_row0 = q0 + warp * 16 * M;  // this warp's rows: warp_row0 .. + 16 M - 1
  const int tp = PaddedT(t), last_tile = min(q0 + kDsRows - 1, t - 1) / kTile;
  const auto* ds_head = reinterpret_cast<const __nv_bfloat16*>(ds) + (int64_t{bi} * h + head) * DsHeadElems(t);
  auto load = [&](int buf, int kt) {
    LoadRows<D, kTile>(sm.k[buf], k, bi, kt * kTile, head, t, h);
    // dS^T's 64 rows over queries q0 .. q0 + 127; stored from query 64 kt on, zeros before.
    const __nv_bfloat16* tile = ds_head + DsTileBase(kt, tp);
    const int ld = DsRowLength(kt, tp);
    constexpr int kChunks = kDsRows / 8;
    for (int i = threadIdx.x; i < kTile * kChunks; i += blockDim.x) {
      const int r = i / kChunks, query = q0 + (i % kChunks) * 8;
      const bool in = query >= kt * kTile && query < t;
      CpAsync16(sm.ds[buf] + r * kDsLd + (i % kChunks) * 8, tile + (in ? int64_t{r} * ld + query - kt * kTile : 0), in);
    }
  };
  load(0, 0);
  CpAsyncCommit();
  float dq_acc[M][D / 8][4] = {};
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int buf = kt % 2;
    NextTileThenWait(kt < last_tile, [&] { load(buf ^ 1, kt + 1); });
    if (kt * kTile <= warp_row0 + 16 * M - 1) {  // else every key here is after every row of this warp
#pragma unroll
      for (int j = 0; j < kTile / 16; ++j) {
        uint32_t fa[M][4];
#pragma unroll
        for (int i = 0; i < M; ++i) LoadATrans(fa[i], sm.ds[buf] + j * 16 * kDsLd + warp * 16 * M + 16 * i, kDsLd);
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
          uint32_t fb[4];
          LoadBFromRowsK(fb, sm.k[buf] + j * 16 * kLd<D> + dp * 16, kLd<D>);
#pragma unroll
          for (int i = 0; i < M; ++i) {
            Mma(dq_acc[i][2 * dp], fa[i], fb[0], fb[1]);
            Mma(dq_acc[i][2 * dp + 1], fa[i], fb[2], fb[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int i = 0; i < M; ++i) StoreRowsToGlobal<D>(dq, dq_acc[i], scale, bi, warp_row0 + 16 * i, head, t, h);
}

template <int D>
struct QuerySmem {
  __nv_bfloat16 q[kTile * kLd<D>], dout[kTile * kLd<D>];
  __nv_bfloat16 k[2][kTile * kLd<D>], v[2][kTile * kLd<D>];
  float lse[kTile], delta[kTile];
};

// dQ for 64 queries without dS^T: over the key tiles at or before them, S and dP computed
// again (the backward's previous design, kept to time beside the dS one).
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    QueryKernel(Bf16* dq, const Bf16* dout, const float* lse, const float* delta, const Bf16* q, const Bf16* k,
                const Bf16* v, int t, int h, float scale) {
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<QuerySmem<D>*>(raw);
  const int qt = gridDim.x - 1 - blockIdx.x;  // the longest rows first
  const int q0 = qt * kTile, head = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int64_t stats = (int64_t{bi} * h + head) * t;
  const float scale2 = scale * kLog2e;
  LoadRows<D, kTile>(sm.q, q, bi, q0, head, t, h);
  LoadRows<D, kTile>(sm.dout, dout, bi, q0, head, t, h);
  LoadFloats(sm.lse, lse, stats, q0, kTile, t);
  LoadFloats(sm.delta, delta, stats, q0, kTile, t);
  LoadRows<D, kTile>(sm.k[0], k, bi, 0, head, t, h);
  LoadRows<D, kTile>(sm.v[0], v, bi, 0, head, t, h);
  CpAsyncCommit();
  float dq_acc[D / 8][4] = {};
  const int row0 = q0 + warp * 16 + g;  // and row0 + 8
  float row_lse[2], row_delta[2];
  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * kTile, buf = kt % 2;
    NextTileThenWait(kt < qt, [&] {
      LoadRows<D, kTile>(sm.k[buf ^ 1], k, bi, k0 + kTile, head, t, h);
      LoadRows<D, kTile>(sm.v[buf ^ 1], v, bi, k0 + kTile, head, t, h);
    });
    if (kt == 0) {
      for (int r = 0; r < 2; ++r) {
        row_lse[r] = sm.lse[warp * 16 + g + 8 * r] * kLog2e;
        row_delta[r] = sm.delta[warp * 16 + g + 8 * r];
      }
    }
    float s[kTile / 8][4] = {}, dp[kTile / 8][4] = {};
    RowsTimesRowsT<D, kTile>(s, sm.q + warp * 16 * kLd<D>, sm.k[buf]);      // S = Q_w K^T
    RowsTimesRowsT<D, kTile>(dp, sm.dout + warp * 16 * kLd<D>, sm.v[buf]);  // dP = dO_w V^T
#pragma unroll
    for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + nt * 8 + 2 * c + (e & 1), r = e >= 2 ? 1 : 0, row = row0 + 8 * r;
        const float p = key <= row && key < t && row < t ? exp2f(s[nt][e] * scale2 - row_lse[r]) : 0.f;
        s[nt][e] = p * (dp[nt][e] - row_delta[r]);  // dS
      }
    }
    RegsTimesRows<D, kTile>(dq_acc, s, sm.k[buf]);  // dQ_w += dS K (scaled at the end)
    __syncthreads();
  }
  StoreRowsToGlobal<D>(dq, dq_acc, scale, bi, q0 + warp * 16, head, t, h);
}

// The scratch: delta (B H T floats), then dS^T for the sequences of one pass over the batch:
// as few passes as keep it within kDsBudget (at least one sequence a pass), of equal size
// (each pass's kernels end in a tail where the GPU is partly idle: 7B's 4 sequences run in 2
// passes of 2, 264 MiB, not 3 + 1).
constexpr int64_t kDsBudget = int64_t{512} << 20;

// Sequences a pass when `fit` sequences' dS fit: the fewest passes, of equal size.
int64_t SequencesAPass(int64_t b, int64_t fit) {
  const int64_t passes = (b + fit - 1) / fit;
  return (b + passes - 1) / passes;
}
constexpr int64_t AlignUp(int64_t n) { return (n + 255) / 256 * 256; }
constexpr int64_t DeltaBytes(int b, int t, int h) { return AlignUp(int64_t{b} * h * t * 4); }
constexpr int64_t DsSequenceBytes(int t, int h) { return int64_t{h} * DsHeadElems(t) * 2; }

enum class DqPath { kFromDs, kRecompute };

// TIERD_ATTENTION_DQ=recompute: dQ by the query kernel that computes S and dP again (the
// previous design), to time a whole step beside the dS one in the same call.
DqPath DqPathFromEnvironment() {
  static const DqPath path = [] {
    const char* v = std::getenv("TIERD_ATTENTION_DQ");
    return v != nullptr && std::string_view(v) == "recompute" ? DqPath::kRecompute : DqPath::kFromDs;
  }();
  return path;
}

// One part of the backward for sequences [b0, b0 + nb): the pointers offset to b0.
struct BackwardArgs {
  Bf16 *dq, *dk, *dv, *ds;
  const Bf16 *dout, *out, *q, *k, *v;
  const float* lse;
  float* delta;
  int b, t, h;
  cudaStream_t stream;

  BackwardArgs Sequences(int b0, int nb, int d) const {
    const int64_t rows = int64_t{b0} * t * h * d, stats = int64_t{b0} * h * t;
    return {dq + rows, dk + rows,   dv + rows,     ds, dout + rows, out + rows, q + rows, k + rows,
            v + rows,  lse + stats, delta + stats, nb, t,           h,          stream};
  }
};

template <int D>
cudaError_t RunPart(AttentionBackwardPart part, DqPath path, const BackwardArgs& a) {
  const float scale = 1.f / sqrtf(static_cast<float>(D));
  const dim3 tiles((a.t + kTile - 1) / kTile, a.h, a.b);
  switch (part) {
    case AttentionBackwardPart::kDelta: {
      const int64_t rows = int64_t{a.b} * a.h * a.t;
      DeltaKernel<<<static_cast<int>((rows * 32 + 255) / 256), 256, 0, a.stream>>>(a.delta, a.dout, a.out, a.b, a.t,
                                                                                   a.h, D);
      return cudaPeekAtLastError();
    }
    case AttentionBackwardPart::kKeys:
      return Launch(KeyKernel<D>, sizeof(KeySmem<D>), tiles, a.stream, a.dk, a.dv,
                    path == DqPath::kFromDs ? a.ds : nullptr, a.dout, a.lse, a.delta, a.q, a.k, a.v, a.t, a.h, scale);
    case AttentionBackwardPart::kQueries:
      if (path == DqPath::kRecompute) {
        return Launch(QueryKernel<D>, sizeof(QuerySmem<D>), tiles, a.stream, a.dq, a.dout, a.lse, a.delta, a.q, a.k,
                      a.v, a.t, a.h, scale);
      }
      return Launch(QueryFromDsKernel<D>, sizeof(DsQuerySmem<D>), dim3((a.t + kDsRows - 1) / kDsRows, a.h, a.b),
                    a.stream, a.dq, a.ds, a.k, a.t, a.h, scale);
  }
  return cudaErrorInvalidValue;
}

cudaError_t RunBackward(AttentionBackwardPart first, AttentionBackwardPart last, DqPath path, Bf16* dq, Bf16* dk,
                        Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse, void* scratch,
                        int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, int d,
                        cudaStream_t stream) {
  auto* delta = static_cast<float*>(scratch);
  const int64_t ds_room = scratch_bytes - DeltaBytes(b, t, h);
  const int64_t fit = std::min<int64_t>(b, ds_room / DsSequenceBytes(t, h));
  if (fit < 1) return cudaErrorInvalidValue;  // smaller than AttentionBackwardScratchBytes
  const int chunk = static_cast<int>(SequencesAPass(b, fit));
  auto* ds = reinterpret_cast<Bf16*>(static_cast<char*>(scratch) + DeltaBytes(b, t, h));
  const BackwardArgs all{dq, dk, dv, ds, dout, out, q, k, v, lse, delta, b, t, h, stream};
  for (int b0 = 0; b0 < b; b0 += chunk) {
    const BackwardArgs part = all.Sequences(b0, std::min(chunk, b - b0), d);
    for (int p = static_cast<int>(first); p <= static_cast<int>(last); ++p) {
      const auto which = static_cast<AttentionBackwardPart>(p);
      const cudaError_t e = d == 64 ? RunPart<64>(which, path, part) : RunPart<128>(which, path, part);
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

}  // namespace
}  // namespace attention_tc

int64_t AttentionBackwardScratchBytes(int b, int t, int h, int d, int sequences_at_once) {
  if (!TensorCoreAttention(d)) return attention_tc::DeltaBytes(b, t, h);
  const int64_t per_sequence = attention_tc::DsSequenceBytes(t, h), batch = std::max(b, 1);
  const int64_t fit =
      std::clamp<int64_t>(sequences_at_once > 0 ? sequences_at_once : attention_tc::kDsBudget / per_sequence, 1, batch);
  return attention_tc::DeltaBytes(b, t, h) + attention_tc::SequencesAPass(batch, fit) * per_sequence;
}

cudaError_t AttentionBackwardPartTc(AttentionBackwardPart part, bool recompute_dq, Bf16* dq, Bf16* dk, Bf16* dv,
                                    const Bf16* dout, const Bf16* out, const float* lse, void* scratch,
                                    int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                                    int h, int d, cudaStream_t stream) {
  return attention_tc::RunBackward(part, part,
                                   recompute_dq ? attention_tc::DqPath::kRecompute : attention_tc::DqPath::kFromDs, dq,
                                   dk, dv, dout, out, lse, scratch, scratch_bytes, q, k, v, b, t, h, d, stream);
}

cudaError_t AttentionBackwardTc(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                                void* scratch, int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v,
                                int b, int t, int h, int d, cudaStream_t stream) {
  return attention_tc::RunBackward(AttentionBackwardPart::kDelta, AttentionBackwardPart::kQueries,
                                   attention_tc::DqPathFromEnvironment(), dq, dk, dv, dout, out, lse, scratch,
                                   scratch_bytes, q, k, v, b, t, h, d, stream);
}

}  // namespace tierd::trainer::gpu
