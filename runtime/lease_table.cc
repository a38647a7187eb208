#include "runtime/lease_table.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/units.h"
#include "runtime/lease_table_internal.h"

namespace tierd {
namespace {

// Where a new lease goes first when no pin says otherwise.
std::vector<Tier> PreferredTiers(TensorClass c) {
  if (c == TensorClass::kOptState) return {Tier::kDram, Tier::kNvme, Tier::kGpu};
  return {Tier::kGpu, Tier::kDram, Tier::kNvme};
}

}  // namespace

absl::StatusOr<std::unique_ptr<LeaseTable>> LeaseTable::Create(TierStore& store, Mover& mover, Clock& clock,
                                                               std::vector<PinRule> pins,
                                                               std::vector<PriorityRule> priorities) {
  std::unique_ptr<LeaseTable> table(new LeaseTable(store, mover, clock));
  for (const PinRule& rule : pins) {
    try {
      table->pins_.emplace_back(std::regex(rule.pattern, std::regex::ECMAScript), rule.tier);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrFormat("pin pattern '%s' is not a valid regular expression: %s", rule.pattern, e.what()));
    }
  }
  for (const PriorityRule& rule : priorities) {
    try {
      table->priorities_.emplace_back(std::regex(rule.pattern, std::regex::ECMAScript), rule.priority);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "eviction priority pattern '%s' is not a valid regular expression: %s", rule.pattern, e.what()));
    }
  }
  return table;
}

int LeaseTable::PriorityFor(const std::string& name) const {
  for (const auto& [pattern, priority] : priorities_) {
    if (std::regex_match(name, pattern)) return priority;
  }
  return 0;
}

LeaseTable::~LeaseTable() {
  std::vector<SessionId> ids;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, session] : sessions_) ids.push_back(id);
  }
  for (SessionId id : ids) CloseSession(id).IgnoreError();
}

std::optional<Tier> LeaseTable::PinFor(const std::string& name) const {
  for (const auto& [pattern, tier] : pins_) {
    if (std::regex_match(name, pattern)) return tier;
  }
  return std::nullopt;
}

absl::StatusOr<SessionId> LeaseTable::OpenSession(const std::string& label, const SessionQuota& quota) {
  auto session = std::make_shared<Session>();
  session->label = label;
  session->quota = quota;
  for (Tier tier : {Tier::kGpu, Tier::kDram}) {
    const uint64_t bytes = tier == Tier::kGpu ? quota.gpu_bytes : quota.dram_bytes;
    if (bytes == 0) continue;
    auto arena = store_.CreateArena(tier, bytes, label + "-" + TierName(tier));
    if (!arena.ok()) {
      if (session->gpu_arena != kNoArena) store_.DestroyArena(session->gpu_arena).IgnoreError();
      return arena.status();
    }
    (tier == Tier::kGpu ? session->gpu_arena : session->dram_arena) = *arena;
  }
  absl::MutexLock lock(&mutex_);
  session->id = next_session_++;
  sessions_[session->id] = session;
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.sessions;
  return session->id;
}

absl::Status LeaseTable::CloseSession(SessionId id) {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mutex_);
    auto it = sessions_.find(id);
    if (it == sessions_.end()) return absl::NotFoundError(absl::StrFormat("no session %d", id));
    session = std::move(it->second);
    sessions_.erase(it);
  }
  absl::MutexLock lock(&session->mutex);  // waits for an operation holding the lock
  session->closed = true;                 // no new operation starts
  // Copies in flight let the lock go: wait for them to land before freeing their memory.
  session->mutex.Await(absl::Condition(
      +[](Session* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        for (const auto& [tid, t] : s->tensors) {
          if (t->busy > 0) return false;
        }
        return true;
      },
      session.get()));
  uint64_t leases = 0;
  for (auto& [tensor_id, tensor] : session->tensors) {
    DropCopy(*session, *tensor, Tier::kNvme);  // the shared NVMe arena; the others go whole
    ++leases;
  }
  session->tensors.clear();
  session->by_name.clear();
  session->closed = true;
  for (ArenaId arena : {session->gpu_arena, session->dram_arena}) {
    if (arena != kNoArena) TIERD_CHECK_OK(store_.DestroyArena(arena));
  }
  absl::MutexLock stats_lock(&stats_mutex_);
  --stats_.sessions;
  stats_.leases -= leases;
  return absl::OkStatus();
}

absl::StatusOr<SessionQuota> LeaseTable::Quota(SessionId id) const {
  auto session = GetSession(id);
  if (!session.ok()) return session.status();
  return (*session)->quota;
}

uint64_t LeaseTable::UsedIn(Session& s, Tier tier) const {
  if (tier == Tier::kNvme) return s.nvme_used;
  return s.ArenaOf(tier) == kNoArena ? 0 : store_.ArenaStats(s.ArenaOf(tier)).used_bytes;
}

void LeaseTable::NotePeak(Session& s, Tier tier) {
  uint64_t& peak = s.peak[static_cast<int>(tier)];
  peak = std::max(peak, UsedIn(s, tier));
}

absl::StatusOr<std::array<LeaseTable::TierUsage, kTierCount>> LeaseTable::Usage(SessionId id, bool reset_peaks) {
  auto session = GetSession(id);
  if (!session.ok()) return session.status();
  Session& s = **session;
  absl::MutexLock lock(&s.mutex);
  std::array<TierUsage, kTierCount> out;
  const uint64_t quotas[kTierCount] = {s.quota.gpu_bytes, s.quota.dram_bytes, s.quota.nvme_bytes};
  for (int k = 0; k < kTierCount; ++k) {
    const Tier tier = static_cast<Tier>(k);
    out[k] = {quotas[k], UsedIn(s, tier), std::max(s.peak[k], UsedIn(s, tier))};
    if (reset_peaks) s.peak[k] = out[k].used;
  }
  return out;
}

ArenaId LeaseTable::SessionArena(SessionId id, Tier tier) const {
  auto session = GetSession(id);
  return session.ok() ? (*session)->ArenaOf(tier) : kNoArena;
}

absl::StatusOr<std::shared_ptr<LeaseTable::Session>> LeaseTable::GetSession(SessionId id) const {
  absl::MutexLock lock(&mutex_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return absl::NotFoundError(absl::StrFormat("no session %d", id));
  return it->second;
}

absl::StatusOr<LeaseTable::Tensor*> LeaseTable::GetTensor(Session& s, TensorId id) const {
  if (s.closed) return absl::NotFoundError(absl::StrFormat("session %d is closed", s.id));
  auto it = s.tensors.find(id);
  if (it == s.tensors.end()) {
    return absl::NotFoundError(absl::StrFormat("session '%s' has no tensor %d", s.label, id));
  }
  return it->second.get();
}

absl::StatusOr<TensorId> LeaseTable::Lease(SessionId session_id, const TensorSpec& spec) {
  auto bytes = ValidateTensorSpec(spec);
  if (!bytes.ok()) return bytes.status();
  auto session = GetSession(session_id);
  if (!session.ok()) return session.status();
  Session& s = **session;
  absl::MutexLock lock(&s.mutex);
  if (s.closed) return absl::NotFoundError("session is closed");
  if (s.by_name.count(spec.name) > 0) {
    return absl::AlreadyExistsError(
        absl::StrFormat("session '%s' already leases a tensor named '%s'", s.label, spec.name));
  }
  auto tensor = std::make_unique<Tensor>();
  tensor->id = s.next_tensor++;
  // The planner hears of it first: its layout may have a place for it.
  if (s.planner != nullptr) s.planner->Leased(tensor->id, spec.name);
  tensor->spec = spec;
  tensor->bytes = *bytes;
  tensor->pinned = PinFor(spec.name);
  tensor->priority = PriorityFor(spec.name);
  // A pinned lease goes to its tier (evicting if it must); others take the first
  // preferred tier with room, without disturbing anything.
  std::vector<Tier> order = tensor->pinned ? std::vector<Tier>{*tensor->pinned}
                                           : PreferredTiers(spec.tensor_class);
  std::vector<std::string> refusals;
  for (Tier tier : order) {
    auto extent = AllocateIn(s, tier, *bytes, /*evict=*/tensor->pinned.has_value(), tensor->id);
    if (extent.ok()) {
      tensor->copies[static_cast<int>(tier)] = *extent;
      break;
    }
    refusals.push_back(std::string(extent.status().message()));
  }
  if (tensor->CopyCount() == 0) {
    if (s.planner != nullptr) s.planner->Unleased(tensor->id);
    std::string why;
    for (const std::string& r : refusals) why += "\n  " + r;
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot lease '%s' (%s): no tier of session '%s' has room:%s", spec.name,
        FormatBytes(*bytes), s.label, why));
  }
  const TensorId id = tensor->id;
  s.by_name[spec.name] = id;
  s.tensors[id] = std::move(tensor);
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.leases;
  return id;
}

absl::Status LeaseTable::Unlease(SessionId session_id, TensorId id) {
  return OnTensor<absl::Status>(session_id, id, [&](Session& s, Tensor& t) {
    if (t.acquired > 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "'%s' is still acquired (%d time(s)): release it first", t.spec.name, t.acquired));
    }
    for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) DropCopy(s, t, tier);
    s.by_name.erase(t.spec.name);
    s.tensors.erase(id);  // `t` is gone from here on
    if (s.planner != nullptr) s.planner->Unleased(id);
    absl::MutexLock stats_lock(&stats_mutex_);
    --stats_.leases;
    return absl::OkStatus();
  });
}

absl::StatusOr<TensorId> LeaseTable::Find(SessionId session_id, const std::string& name) const {
  auto session = GetSession(session_id);
  if (!session.ok()) return session.status();
  absl::MutexLock lock(&(*session)->mutex);
  auto it = (*session)->by_name.find(name);
  if (it == (*session)->by_name.end()) {
    return absl::NotFoundError(absl::StrFormat("no tensor named '%s' in this session", name));
  }
  return it->second;
}

}  // namespace tierd
