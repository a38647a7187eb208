// The hot path: a pair of bounded single-producer/single-consumer rings in one shared
// memory segment; a session has one to limits::kRingsPerSessionMax of them (its client's
// threads call at once, each on a segment of its own). The client pushes acquire/release
// requests on one ring; the daemon's thread for that segment pops them, answers on the
// other. No syscall while the
// other side is awake: each side spins briefly on the ring, then sleeps on a futex in
// the shared page (FUTEX_WAIT without the private flag, so it works across processes).
//
// Invariants:
//   1. Only the producer writes `head` and the slots in [tail, head); only the consumer
//      writes `tail`. Both are free-running counters; head - tail <= kRingSlots.
//   2. A slot is written before the head store (release) that publishes it and read after
//      the head load (acquire) that sees it.
//   3. The daemon trusts nothing in the segment: a counter pair breaking invariant 1 or a
//      malformed message ends the session (ProtocolError), never the daemon.
#ifndef TIERD_IPC_RING_H_
#define TIERD_IPC_RING_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd::ipc {

inline constexpr uint32_t kRingSlots = 64;
inline constexpr uint32_t kRingMagic = 0x74724731;  // "trG1"
inline constexpr int kRingSpinIterations = 4000;     // ~10-40 us before sleeping
inline constexpr uint32_t kRingVersion = 2;          // 2: the answers' error texts
// An answer's error text: at most this many bytes with its terminating NUL.
inline constexpr uint32_t kRingErrorBytes = 1024;

// kOpBegin: the client is about to run op `tensor_id` of its registered graph.
enum class RingOp : uint32_t { kAcquire = 1, kRelease = 2, kOpBegin = 3 };

struct RingMessage {
  uint64_t sequence;   // echoed in the response
  uint32_t op;         // RingOp
  uint8_t access;      // 0 read, 1 write, 2 overwrite
  uint8_t place;       // 0 gpu, 1 host
  uint16_t reserved;
  uint64_t tensor_id;
  int32_t code;        // response: absl::StatusCode
  uint32_t fetched;    // response: 1 if a demand fetch happened
  uint64_t arena;      // response placement
  uint64_t offset;
  uint64_t bytes;
  uint64_t event;      // release: 1 + index of the client's event recorded after its GPU work; 0: none
};
static_assert(sizeof(RingMessage) == 64, "one cache line per message");

struct alignas(64) Ring {
  alignas(64) std::atomic<uint32_t> head;     // also the futex word consumers sleep on
  alignas(64) std::atomic<uint32_t> tail;
  alignas(64) std::atomic<uint32_t> sleepers;  // consumers asleep (0 or 1)
  alignas(64) RingMessage slots[kRingSlots];
};

struct RingSegment {
  uint32_t magic;
  uint32_t version;
  std::atomic<uint32_t> closed;  // set by either side when leaving; wakes the other
  Ring requests;   // client -> daemon
  Ring responses;  // daemon -> client
  // Why an answer with a nonzero code failed, NUL-terminated, in slot sequence % kRingSlots:
  // written by the daemon before the answer's push publishes it, read by the client after
  // its pop (at most kRingSlots requests are in flight, so no two share a slot). The client
  // reads it without trusting it (RingErrorText bounds it), so it never asks again.
  char errors[kRingSlots][kRingErrorBytes];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "rings need lock-free atomics");

// Producer side: false when full.
bool RingPush(Ring& ring, const RingMessage& message);
// Consumer side: OK with a message; UNAVAILABLE when `closed` was set; DATA_LOSS when the
// counters break invariant 1; DEADLINE_EXCEEDED after `timeout_ms` with nothing (-1: never).
absl::StatusOr<RingMessage> RingPop(Ring& ring, const std::atomic<uint32_t>& closed, int timeout_ms);
// Wakes a consumer sleeping on `ring` (after a push, or to make it see `closed`).
void RingWake(Ring& ring);
// The daemon's side: the error text of the answer to `sequence` (cut to fit its slot).
void SetRingErrorText(RingSegment& segment, uint64_t sequence, absl::string_view text);
// The client's side: that text, read within its slot whatever the bytes there.
std::string RingErrorText(const RingSegment& segment, uint64_t sequence);

// Creates a fresh segment in an anonymous memfd: returns the fd; the caller maps it.
absl::StatusOr<int> CreateRingSegment();
absl::StatusOr<RingSegment*> MapRingSegment(int fd);  // checks magic and version
void UnmapRingSegment(RingSegment* segment);

}  // namespace tierd::ipc

#endif  // TIERD_IPC_RING_H_
