#include "ipc/tierd_service.h"

#include "ipc/hot_path_door.h"

#include "ipc/hello_server.h"
#include "ipc/proto_convert.h"

#include "absl/strings/numbers.h"

namespace tierd::ipc {

void SessionDirectory::Add(SessionId session, std::string token) {
  absl::MutexLock lock(&mutex_);
  tokens_[session] = std::move(token);
}

void SessionDirectory::Remove(SessionId session) {
  absl::MutexLock lock(&mutex_);
  tokens_.erase(session);
}

absl::Status SessionDirectory::Check(const v1::SessionRef& ref) const {
  absl::MutexLock lock(&mutex_);
  auto it = tokens_.find(ref.session_id());
  bool same = it != tokens_.end() && it->second.size() == ref.token().size();
  if (same) {
    unsigned char difference = 0;
    for (size_t i = 0; i < it->second.size(); ++i) difference |= it->second[i] ^ ref.token()[i];
    same = difference == 0;
  }
  if (!same) {
    return absl::PermissionDeniedError(
        "unknown session or wrong token (sessions are opened by a hello on tierd's Unix socket)");
  }
  return absl::OkStatus();
}

namespace {

absl::Status OnlyOverUnixSocket(const grpc::ServerContext* context) {
  if (context->peer().rfind("unix:", 0) == 0) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "administration is only allowed over tierd's Unix socket (peer " + context->peer() + ")");
}

// Over the Unix socket, with the metadata of a session opened by a hello: the hello checked
// the caller's uid (SO_PEERCRED) against security.allowed_uids, which gRPC cannot do (a
// member of the socket's group is not thereby allowed).
absl::Status AdminCaller(const grpc::ServerContext* context, const SessionDirectory& sessions) {
  if (absl::Status s = OnlyOverUnixSocket(context); !s.ok()) return s;
  const auto& metadata = context->client_metadata();
  const auto id = metadata.find(kSessionMetadata);
  const auto token = metadata.find(kTokenMetadata);
  uint64_t session = 0;
  if (id == metadata.end() || token == metadata.end() ||
      !absl::SimpleAtoi(absl::string_view(id->second.data(), id->second.size()), &session)) {
    return absl::PermissionDeniedError(
        "administration and listings need a session of an allowed uid: say hello on tierd's socket first "
        "(tierctl does; an observer hello leases nothing) and send its id and token (security.allowed_uids)");
  }
  v1::SessionRef ref;
  ref.set_session_id(session);
  ref.set_token(std::string(token->second.data(), token->second.size()));
  return sessions.Check(ref);
}

}  // namespace

#define TIERD_RETURN_IF_ERROR(expression)                 \
  do {                                                    \
    const absl::Status tierd_status_ = (expression);      \
    if (!tierd_status_.ok()) return ToGrpc(tierd_status_); \
  } while (0)

grpc::Status TierdService::Lease(grpc::ServerContext*, const v1::LeaseRequest* request,
                                 v1::LeaseReply* reply) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  auto spec = FromProto(request->spec());
  TIERD_RETURN_IF_ERROR(spec.status());
  auto id = leases_.Lease(request->session().session_id(), *spec);
  TIERD_RETURN_IF_ERROR(id.status());
  reply->set_tensor_id(*id);
  reply->set_bytes(*ValidateTensorSpec(*spec));
  return grpc::Status::OK;
}

grpc::Status TierdService::Unlease(grpc::ServerContext*, const v1::TensorRef* request, v1::Empty*) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  return ToGrpc(leases_.Unlease(request->session().session_id(), request->tensor_id()));
}

grpc::Status TierdService::Acquire(grpc::ServerContext*, const v1::AcquireRequest* request,
                                   v1::AcquireReply* reply) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  auto decoded = FromProto(*request);
  TIERD_RETURN_IF_ERROR(decoded.status());
  auto placement = Serve(hot_path_, request->session().session_id(), *decoded);
  TIERD_RETURN_IF_ERROR(placement.status());
  ToReply(*placement, reply);
  return grpc::Status::OK;
}

grpc::Status TierdService::Release(grpc::ServerContext*, const v1::TensorRef* request, v1::Empty*) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  return ToGrpc(Serve(hot_path_, request->session().session_id(), ReleaseFromProto(*request)).status());
}

grpc::Status TierdService::MarkIteration(grpc::ServerContext*, const v1::MarkIterationRequest* request,
                                         v1::PlanReply* reply) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  if (planner_ == nullptr) return ToGrpc(absl::UnimplementedError("this tierd has no planner"));
  auto plan = planner_->MarkIteration(request->session().session_id());
  TIERD_RETURN_IF_ERROR(plan.status());
  *reply = *std::move(plan);
  return grpc::Status::OK;
}

grpc::Status TierdService::ReportStep(grpc::ServerContext*, const v1::StepReport* request, v1::Empty*) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  TIERD_RETURN_IF_ERROR(steps_.Report(request->session().session_id(), *request));
  return grpc::Status::OK;
}

grpc::Status TierdService::Pin(grpc::ServerContext*, const v1::PinRequest* request, v1::Empty*) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  auto tier = FromProto(request->tier());
  TIERD_RETURN_IF_ERROR(tier.status());
  const absl::Status pinned = leases_.Pin(request->session().session_id(), request->tensor_id(), *tier);
  if (pinned.ok() && planner_ != nullptr) planner_->PinsChanged(request->session().session_id());
  return ToGrpc(pinned);
}

grpc::Status TierdService::Unpin(grpc::ServerContext*, const v1::TensorRef* request, v1::Empty*) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  const absl::Status unpinned = leases_.Unpin(request->session().session_id(), request->tensor_id());
  if (unpinned.ok() && planner_ != nullptr) planner_->PinsChanged(request->session().session_id());
  return ToGrpc(unpinned);
}

grpc::Status TierdService::SessionUsage(grpc::ServerContext*, const v1::SessionUsageRequest* request,
                                        v1::SessionUsageReply* reply) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  auto usage = leases_.Usage(request->session().session_id(), request->reset_peaks());
  TIERD_RETURN_IF_ERROR(usage.status());
  for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
    const LeaseTable::TierUsage& u = (*usage)[static_cast<int>(tier)];
    v1::TierUsage* out = reply->add_tiers();
    out->set_tier(ToProto(tier));
    out->set_quota_bytes(u.quota);
    out->set_used_bytes(u.used);
    out->set_peak_bytes(u.peak);
  }
  return grpc::Status::OK;
}

grpc::Status TierdService::ListLeases(grpc::ServerContext* context, const v1::ListLeasesRequest* request,
                                      v1::ListLeasesReply* reply) {
  // Tensor names, offsets and pins of every session: for the node's allowed users (the Unix
  // socket, with a token from a hello), never for whoever reaches the TCP port or the socket.
  TIERD_RETURN_IF_ERROR(AdminCaller(context, sessions_));
  std::optional<SessionId> only;
  if (request->session_id() != 0) only = request->session_id();
  for (const LeaseView& view : leases_.List(only)) {
    v1::LeaseInfo* info = reply->add_leases();
    info->set_session_id(view.session);
    info->set_tensor_id(view.id);
    *info->mutable_spec() = ToProto(view.spec);
    info->set_bytes(view.bytes);
    for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
      if (!view.copies[static_cast<int>(tier)]) continue;
      info->add_copies(ToProto(tier));
      info->add_offsets(view.offsets[static_cast<int>(tier)]);
      info->add_extents(view.extents[static_cast<int>(tier)]);
    }
    if (view.pinned) info->set_pinned(ToProto(*view.pinned));
    info->add_refetches(view.refetches[static_cast<int>(Tier::kGpu)]);
    info->add_refetches(view.refetches[static_cast<int>(Tier::kDram)]);
    info->set_thrash_locked(view.thrash_locked);
    info->set_acquired(view.acquired);
  }
  return grpc::Status::OK;
}

grpc::Status TierdService::Stats(grpc::ServerContext*, const v1::Empty*, v1::StatsReply* reply) {
  for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
    const TierStats stats = store_.Stats(tier);
    v1::TierStats* out = reply->add_tiers();
    out->set_tier(ToProto(tier));
    out->set_budget_bytes(stats.budget_bytes);
    out->set_reserved_bytes(stats.reserved_bytes);
    out->set_used_bytes(stats.allocator.used_bytes);
    out->set_largest_free_block_bytes(stats.allocator.largest_free_block_bytes);
    out->set_fragmentation(stats.allocator.fragmentation);
    out->set_arenas(stats.arena_count);
    out->set_peak_used_bytes(stats.peak_used_bytes);
  }
  for (Link link : {Link::kDramToGpu, Link::kGpuToDram, Link::kDramToNvme, Link::kNvmeToDram}) {
    const LinkStats stats = mover_.Stats(link);
    v1::LinkStats* out = reply->add_links();
    out->set_link(LinkName(link));
    out->set_bytes(stats.bytes);
    out->set_moves(stats.moves);
    out->set_failed_moves(stats.failed_moves);
    out->set_busy_seconds(stats.busy_nanos / 1e9);
  }
  const LeaseStats leases = leases_.Stats();
  reply->set_sessions(leases.sessions);
  reply->set_leases(leases.leases);
  reply->set_stalls(leases.stalls);
  reply->set_stall_seconds(leases.stall_nanos / 1e9);
  reply->set_evictions_capacity(leases.evictions_capacity);
  reply->set_evictions_explicit(leases.evictions_explicit);
  reply->set_writebacks(leases.writebacks);
  reply->set_prefetches(leases.prefetches);
  reply->set_prefetch_bytes(leases.prefetch_bytes);
  reply->set_planned_evictions(leases.planned_evictions);
  reply->set_discards(leases.discards);
  reply->set_acquire_hits(leases.acquire_hits);
  reply->set_planned_placements(leases.planned_placements);
  reply->set_off_plan_placements(leases.off_plan_placements);
  reply->set_layout_waits(leases.layout_waits);
  reply->set_relocations(leases.relocations);
  reply->set_gpu_relocations(leases.gpu_relocations);
  reply->set_rehomed(leases.rehomed);
  reply->set_nvme_duplicates_dropped(leases.nvme_duplicates_dropped);
  reply->set_refetches(leases.refetches);
  reply->set_thrash_locks(leases.thrash_locks);
  reply->set_thrash_unlocks(leases.thrash_unlocks);
  for (v1::SessionSteps& s : steps_.Snapshot()) *reply->add_session_steps() = std::move(s);
  reply->set_gpu(gpu_description_);
  reply->set_uptime_seconds((clock_.NowNanos() - started_nanos_) / 1e9);
  if (gpu_utilisation_ != nullptr) {
    if (std::optional<double> util = gpu_utilisation_->Recent(1.0)) reply->set_gpu_utilisation_percent(*util);
  }
  return grpc::Status::OK;
}

grpc::Status TierdService::Health(grpc::ServerContext*, const v1::Empty*, v1::HealthReply* reply) {
  reply->set_version("tierd 0.1 (protocol 1)");
  reply->set_uptime_seconds((clock_.NowNanos() - started_nanos_) / 1e9);
  return grpc::Status::OK;
}

grpc::Status TierdService::AdminPin(grpc::ServerContext* context, const v1::AdminPinRequest* request,
                                    v1::Empty*) {
  TIERD_RETURN_IF_ERROR(AdminCaller(context, sessions_));
  auto tensor = leases_.Find(request->session_id(), request->name());
  TIERD_RETURN_IF_ERROR(tensor.status());
  absl::Status changed;
  if (request->tier() == v1::TIER_UNSPECIFIED) {
    changed = leases_.Unpin(request->session_id(), *tensor);
  } else {
    auto tier = FromProto(request->tier());
    TIERD_RETURN_IF_ERROR(tier.status());
    changed = leases_.Pin(request->session_id(), *tensor, *tier);
  }
  if (changed.ok() && planner_ != nullptr) planner_->PinsChanged(request->session_id());
  return ToGrpc(changed);
}

grpc::Status TierdService::GetConfig(grpc::ServerContext* context, const v1::Empty*,
                                     v1::ConfigReply* reply) {
  TIERD_RETURN_IF_ERROR(AdminCaller(context, sessions_));
  reply->set_text(config_text_);
  return grpc::Status::OK;
}

grpc::Status TierdService::RegisterGraph(grpc::ServerContext*, const v1::RegisterGraphRequest* request,
                                         v1::PlanReply* reply) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  if (planner_ == nullptr) return ToGrpc(absl::UnimplementedError("this tierd has no planner"));
  auto plan = planner_->RegisterGraph(request->session().session_id(), request->graph());
  TIERD_RETURN_IF_ERROR(plan.status());
  *reply = *std::move(plan);
  return grpc::Status::OK;
}

grpc::Status TierdService::OpBegin(grpc::ServerContext*, const v1::OpBeginRequest* request, v1::Empty*) {
  TIERD_RETURN_IF_ERROR(sessions_.Check(request->session()));
  return ToGrpc(Serve(hot_path_, request->session().session_id(), OpBeginFromProto(*request)).status());
}

grpc::Status TierdService::GetPlan(grpc::ServerContext* context, const v1::GetPlanRequest* request,
                                   v1::PlanReply* reply) {
  TIERD_RETURN_IF_ERROR(AdminCaller(context, sessions_));
  if (planner_ == nullptr) return ToGrpc(absl::UnimplementedError("this tierd has no planner"));
  auto plan = planner_->GetPlan(request->session_id(), request->explain(), request->trace(), request->graph());
  TIERD_RETURN_IF_ERROR(plan.status());
  *reply = *std::move(plan);
  return grpc::Status::OK;
}

}  // namespace tierd::ipc
