// How a client uses a tensor, in the one vocabulary the tiers (runtime), the planner's
// recorder (prefetcher) and the clients share.
#ifndef TIERD_BASE_ACCESS_H_
#define TIERD_BASE_ACCESS_H_

#include <cstdint>

namespace tierd {

// Where the client wants the bytes: in GPU memory (the GPU tier) or in host memory
// (the DRAM tier, e.g. for a CPU optimizer step).
enum class Place : uint8_t { kGpu, kHost };
// kWrite: the client will change the bytes, so every other copy becomes stale.
// kOverwrite: the client will write every byte without reading: nothing is fetched.
enum class Access : uint8_t { kRead, kWrite, kOverwrite };

}  // namespace tierd

#endif  // TIERD_BASE_ACCESS_H_
