// Every bound of the storage engine, in one place (TigerBeetle style): queues,
// in-flight I/O, block sizes. Pools are sized from these at start-up.
#ifndef TIERD_BASE_LIMITS_H_
#define TIERD_BASE_LIMITS_H_

#include <cstdint>

#include "base/units.h"

namespace tierd::limits {

// O_DIRECT needs buffer, offset and length aligned to the logical block size;
// 4 KiB covers every disk in practice. DRAM and NVMe extents use it.
inline constexpr uint64_t kDirectIoAlignmentBytes = 4 * kKiB;
// GPU extents: cudaMalloc's own guarantee, and enough for vectorised kernels.
inline constexpr uint64_t kGpuAlignmentBytes = 256;

// One NVMe read/write op moves at most one chunk, and each chunk of an NVMe extent
// carries one CRC32C. A power of two in [min, max]; fixed for a daemon's life.
inline constexpr uint64_t kNvmeChunkBytesMin = 64 * kKiB;
inline constexpr uint64_t kNvmeChunkBytesDefault = 1 * kMiB;
inline constexpr uint64_t kNvmeChunkBytesMax = 64 * kMiB;
// The host buffer a move within the GPU may bounce through (MoverOptions::gpu_bounce_bytes):
// beyond ~100 MiB a device copy is faster even beside a trainer's kernels.
inline constexpr uint64_t kGpuJoinBounceBytesMax = 1 * kGiB;
// io_uring submission queue depth (ops in flight on the NVMe link).
inline constexpr uint32_t kNvmeQueueDepthMax = 64;
inline constexpr uint32_t kNvmeQueueDepthDefault = 32;
// io_uring fixed buffers are registered in pieces of at most this size.
inline constexpr uint64_t kNvmeRegisteredBufferBytesMax = 1 * kGiB;

// Moves queued or in flight per link before Submit() blocks (backpressure).
inline constexpr uint32_t kMovesQueuedPerLinkMax = 1024;
// Copies outstanding on one GPU copy stream.
inline constexpr uint32_t kGpuCopiesInFlightMax = 8;

// A client waiting on its ring looks at its session's socket this often: a tierd that died
// (SIGKILL leaves the ring's closed flag unset) is noticed within this time.
inline constexpr int kClientSessionCheckMs = 250;
// Hot-path rings one session may have, each served by a thread of tierd's.
inline constexpr uint32_t kRingsPerSessionMax = 8;

// Allocations live at once in one tier's allocator.
inline constexpr uint32_t kAllocationsPerTierMax = 1 << 20;

static_assert(kNvmeChunkBytesMin % kDirectIoAlignmentBytes == 0, "chunks must stay O_DIRECT-aligned");
static_assert(kNvmeRegisteredBufferBytesMax % kNvmeChunkBytesMax == 0,
              "a chunk must never straddle two registered buffers");
static_assert(kDirectIoAlignmentBytes % kGpuAlignmentBytes == 0, "alignments nest");
static_assert(kNvmeQueueDepthDefault <= kNvmeQueueDepthMax, "default within bound");
static_assert(IsPowerOfTwo(kNvmeQueueDepthMax), "io_uring rings are powers of two");

}  // namespace tierd::limits

#endif  // TIERD_BASE_LIMITS_H_
