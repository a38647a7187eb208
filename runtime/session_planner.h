// What a session's planner tells the tiers and is told by them, keyed by the table's
// TensorId: one interface between LeaseTable (the records and the room-making) and the
// planner that knows the session's graph (server/planned_session). Set with
// LeaseTable::SetPlanner; without one the tiers make room least-recently-used.
//
// Every call but AwaitPlannedMove comes with the session's lock held: it must not call back
// into the table, and should only look up or record.
#ifndef TIERD_RUNTIME_SESSION_PLANNER_H_
#define TIERD_RUNTIME_SESSION_PLANNER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/tensor.h"

namespace tierd {

// A copy the tiers moved or dropped on their own to make room (a victim written back or
// dropped, a full NVMe's copy of a tensor held above dropped): what a plan did not move but
// the run paid for. `to`: where its bytes went (nullopt: dropped, another copy holds them or
// it was never written); `bytes` moved (0 for a drop); the wall-clock nanos of the move.
struct RoomMove {
  TensorId tensor = 0;
  std::string name;  // for the planner's trace
  Tier from = Tier::kGpu;
  std::optional<Tier> to;
  uint64_t bytes = 0;
  int64_t start_nanos = 0, end_nanos = 0;
};

class SessionPlanner {
 public:
  virtual ~SessionPlanner() = default;
  // The session's tensors: each one leased, told once (those leased before SetPlanner when
  // it is set), and each one unleased. The planner keys what it knows by these ids.
  virtual void Leased(TensorId tensor, const std::string& name) = 0;
  virtual void Unleased(TensorId tensor) = 0;
  // How many ops away the tensor's next use is: room made on demand goes to the furthest
  // (MIN). INT64_MAX / 2 for a tensor the plan does not know. Asked only when RanksUses.
  virtual int64_t NextUse(TensorId tensor) = 0;
  // false: the planner has no order of uses (only a layout, say) and the tiers make room
  // clean copies first, then the least recently used.
  virtual bool RanksUses() const { return true; }
  // Where the plan's static layout puts the tensor in `tier`'s arena now, if it has a place
  // for it: a copy made there goes to that offset when the range is free.
  virtual std::optional<uint64_t> LayoutOffset(TensorId tensor, Tier tier) = 0;
  // Whether the layout has the tensor at `offset` in `tier` for the op the client is on (not
  // only for a later one): a copy there now is where the plan wants it, and leaves as planned.
  virtual bool LaidOutThereNow(TensorId tensor, Tier tier, uint64_t offset) {
    return LayoutOffset(tensor, tier) == offset;
  }
  // With no lock held, before an acquire fetches the tensor into `tier` on demand: returns
  // once the plan's move of it there is done, or there is none queued, or it gives up.
  virtual void AwaitPlannedMove(TensorId tensor, Tier tier) = 0;
  // A move the tiers made on their own for room.
  virtual void ObserveRoomMove(const RoomMove& move) = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_SESSION_PLANNER_H_
