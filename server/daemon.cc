#include "server/daemon.h"

#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/limits.h"
#include "base/units.h"
#include "ipc/hot_path_door.h"
#include "ipc/tierd_service.h"
#include "ipc/undecodable.h"
#include "runtime/uring_block_io.h"
#include "server/config.h"

namespace tierd {
namespace {

// Keeps [A-Za-z0-9._-], at most 24 characters: labels name shm segments.
std::string SafeLabel(const std::string& label) {
  std::string out;
  for (char c : label) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
        c == '-') {
      out += c;
    }
    if (out.size() == 24) break;
  }
  return out.empty() ? "client" : out;
}

absl::StatusOr<std::string> RandomToken() {
  std::string token(ipc::kSessionTokenBytes, '\0');
  if (getrandom(token.data(), token.size(), 0) != static_cast<ssize_t>(token.size())) {
    return absl::InternalError(absl::StrFormat("getrandom: %s", std::strerror(errno)));
  }
  return token;
}

}  // namespace

int SweepStaleSegments(const std::string& shm_directory) {
  // Live segments are flock()ed by their owner (DramSegment); one we can lock
  // exclusively has none. Checked by lock, not by pid: pids mean nothing across pid
  // namespaces (containers, sandboxes) sharing one /dev/shm.
  int removed = 0;
  DIR* dir = opendir(shm_directory.c_str());
  if (dir == nullptr) return 0;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind("tierd-", 0) != 0) continue;
    const std::string path = shm_directory + "/" + name;
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(path.c_str()) == 0) ++removed;
    close(fd);
  }
  closedir(dir);
  return removed;
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  std::unique_ptr<Daemon> daemon(new Daemon());
  daemon->options_ = options;
  daemon->stale_segments_removed_ = SweepStaleSegments("/dev/shm");
  daemon->options_.store.default_arenas = false;
  if (daemon->options_.store.instance_name.empty()) {
    // pid + random: pids repeat across pid namespaces that share /dev/shm.
    uint32_t tag = 0;
    if (getrandom(&tag, sizeof(tag), 0) != sizeof(tag)) tag = static_cast<uint32_t>(time(nullptr));
    daemon->options_.store.instance_name = absl::StrFormat("tierd-%d-%05d", getpid(), tag % 100000);
  }
  if (mkdir(options.runtime_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot create the runtime directory %s: %s", options.runtime_dir, std::strerror(errno)));
  }
  if (options.socket_group && (chown(options.runtime_dir.c_str(), static_cast<uid_t>(-1), *options.socket_group) != 0 ||
                               chmod(options.runtime_dir.c_str(), 0750) != 0)) {
    return absl::FailedPreconditionError(absl::StrFormat("cannot give the runtime directory %s to group %d: %s",
                                                         options.runtime_dir, *options.socket_group,
                                                         std::strerror(errno)));
  }
  auto gpu = OpenGpu(options.gpu);
  if (!gpu.ok()) return gpu.status();
  daemon->gpu_ = std::move(*gpu);
  auto store = TierStore::Open(daemon->options_.store, *daemon->gpu_.device);
  if (!store.ok()) return store.status();
  daemon->store_ = std::move(*store);
  std::unique_ptr<BlockIo> io;
  if (daemon->store_->HasTier(Tier::kNvme)) {
    auto uring = CreateUringBlockIo(daemon->store_->nvme()->fd(), options.nvme_queue_depth);
    if (!uring.ok()) return uring.status();
    io = std::move(*uring);
  }
  auto mover = Mover::Create(*daemon->store_, std::move(io), RealClock(),
                             {.register_nvme_buffers = false,
                              .nvme_chunk_bytes = options.nvme_chunk_bytes,
                              .gpu_bounce_bytes = options.gpu_join_bounce_bytes});
  if (!mover.ok()) return mover.status();
  daemon->mover_ = std::move(*mover);
  auto leases = LeaseTable::Create(*daemon->store_, *daemon->mover_, RealClock(), options.pins, options.priorities);
  if (!leases.ok()) return leases.status();
  daemon->leases_ = std::move(*leases);
  daemon->leases_->SetThrashOptions(options.thrash);
  daemon->leases_->SetLayoutWait(options.planner_layout_wait);
  if (absl::Status status = daemon->StartServers(); !status.ok()) return status;
  return daemon;
}

absl::Status Daemon::StartServers() {
  directory_ = std::make_unique<ipc::SessionDirectory>();
  hot_path_ = std::make_unique<SessionService>(*leases_, RealClock());
  hot_path_->set_observer(this);  // before serving
  service_ = std::make_unique<ipc::TierdService>(*leases_, *hot_path_, *store_, *mover_, *directory_, RealClock(),
                                                 gpu_.device->Describe());
  service_->set_planner(this);
  if (const std::string bus = gpu_.device->PciBusId(); !bus.empty()) {
    auto util = GpuUtilisation::Open(bus);
    if (util.ok()) {
      gpu_utilisation_ = std::move(*util);
      service_->set_gpu_utilisation(gpu_utilisation_.get());
    } else {
      std::fprintf(stderr, "tierd: GPU-Util not reported (%s)\n", std::string(util.status().message()).c_str());
    }
  }
  hello_path_ = options_.runtime_dir + "/tierd.sock";
  grpc_path_ = options_.runtime_dir + "/tierd.grpc.sock";
  // The hello socket first: it refuses to start when another daemon owns the directory.
  auto hello = ipc::HelloServer::Start(hello_path_, options_.allowed_uids, *this);
  if (!hello.ok()) return hello.status();
  unlink(grpc_path_.c_str());
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + grpc_path_, grpc::InsecureServerCredentials());
  int tcp_port = 0;
  if (!options_.grpc_tcp_address.empty() &&
      options_.grpc_tcp_address.find_first_not_of(":0123456789") == std::string::npos) {
    // A bare port: loopback only. Other interfaces must be named explicitly.
    options_.grpc_tcp_address =
        "127.0.0.1:" + options_.grpc_tcp_address.substr(options_.grpc_tcp_address.rfind(':') + 1);
  }
  if (!options_.grpc_tcp_address.empty()) {
    const std::string host = options_.grpc_tcp_address.substr(0, options_.grpc_tcp_address.rfind(':'));
    const bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]" || host.rfind("127.", 0) == 0;
    if (!loopback && !options_.grpc_tcp_public) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "gRPC on %s would be reachable beyond this host, without encryption: tierd serves TCP on loopback only "
          "unless told otherwise (--grpc_tcp_public, or listen.grpc_tcp_public: true in the config)",
          options_.grpc_tcp_address));
    }
    if (!loopback) {
      std::printf(
          "tierd: warning: gRPC on %s is reachable beyond this host, unencrypted (--grpc_tcp_public); "
          "tensor listings and administration stay on the Unix socket\n",
          options_.grpc_tcp_address.c_str());
    }
    builder.AddListeningPort(options_.grpc_tcp_address, grpc::InsecureServerCredentials(), &tcp_port);
  }
  builder.RegisterService(service_.get());
  builder.experimental().SetInterceptorCreators(ipc::UndecodableRequestInterceptors());
  const mode_t old_mask = umask(0177);  // the gRPC socket is born 0600
  grpc_server_ = builder.BuildAndStart();
  umask(old_mask);
  if (grpc_server_ == nullptr || (!options_.grpc_tcp_address.empty() && tcp_port == 0)) {
    return absl::UnavailableError(
        absl::StrFormat("cannot start the gRPC server on %s%s", grpc_path_,
                        options_.grpc_tcp_address.empty() ? "" : " and " + options_.grpc_tcp_address));
  }
  grpc_address_ = "unix:" + grpc_path_;
  hello_server_ = std::move(*hello);
  if (options_.socket_group) {
    for (const std::string& path : {hello_path_, grpc_path_}) {
      if (chown(path.c_str(), static_cast<uid_t>(-1), *options_.socket_group) != 0 || chmod(path.c_str(), 0660) != 0) {
        return absl::FailedPreconditionError(
            absl::StrFormat("cannot open %s to group %d: %s", path, *options_.socket_group, std::strerror(errno)));
      }
    }
  }
  service_->set_config_text(DescribeConfig(options_));
  if (!options_.metrics_address.empty()) {
    auto metrics = MetricsServer::Start(options_.metrics_address, [this] {
      v1::Empty empty;
      v1::StatsReply stats;
      service_->Stats(nullptr, &empty, &stats);
      return RenderPrometheus(stats);
    });
    if (!metrics.ok()) return metrics.status();
    metrics_ = std::move(*metrics);
  }
  return absl::OkStatus();
}

int Daemon::metrics_port() const { return metrics_ ? metrics_->port() : 0; }

Daemon::~Daemon() {
  // Graphs still being planned stop first, so their requests answer before gRPC drains.
  StopPlanning();
  metrics_.reset();
  hello_server_.reset();  // ends every session (OnGoodbye), removes tierd.sock
  rings_.clear();
  release_events_.clear();
  if (grpc_server_) {
    grpc_server_->Shutdown();
    grpc_server_->Wait();
  }
  unlink(grpc_path_.c_str());
  JoinPlanning(/*all=*/true);
  {
    absl::MutexLock lock(&planned_mutex_);
    planned_.clear();  // executors call into the lease table
  }
  leases_.reset();
  if (mover_) mover_->Drain();
}

std::string Daemon::Banner() const {
  std::string out = absl::StrFormat("tierd: listening on %s (hello) and %s (gRPC)%s\n", hello_path_, grpc_address_,
                                    options_.grpc_tcp_address.empty() ? "" : " and " + options_.grpc_tcp_address);
  out += absl::StrFormat("tierd: instance %s (shared memory /dev/shm/%s-*)\n", options_.store.instance_name,
                         options_.store.instance_name);
  if (stale_segments_removed_ > 0) {
    out += absl::StrFormat("tierd: removed %d shared-memory segment(s) left by a tierd that died\n",
                           stale_segments_removed_);
  }
  if (metrics_) {
    out +=
        absl::StrFormat("tierd: metrics at http://%s/metrics (port %d)\n", options_.metrics_address, metrics_->port());
  }
  out += absl::StrFormat("tierd: gpu  %s%s\n", gpu_.device->Describe(),
                         gpu_.fallback_reason.empty() ? "" : " (" + gpu_.fallback_reason + ")");
  for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
    const TierStats stats = store_->Stats(tier);
    out += absl::StrFormat("tierd: %-4s budget %s%s\n", TierName(tier), FormatBytes(stats.budget_bytes),
                           tier == Tier::kNvme && store_->nvme() != nullptr
                               ? " in " + store_->nvme()->path() + " (reserved, unlinked)"
                               : "");
  }
  return out;
}

// One line per session: its quotas and what opening it cost (a large DRAM quota is reserved
// and pinned for the GPU before the hello is answered).
void Daemon::LogSessionOpened(SessionId id, const std::string& label, const SessionQuota& quota, double seconds) {
  std::string dram;
  const ArenaId arena = leases_->SessionArena(id, Tier::kDram);
  if (arena != kNoArena) {
    const DramSegment* segment = store_->dram_segment(arena);
    dram = absl::StrFormat(" (DRAM reserved in %.1f s, pinned in %.1f s)", segment->reserve_seconds(),
                           segment->pin_seconds());
  }
  const std::string line = absl::StrFormat(
      "tierd: session %d (%s) opened in %.1f s: quotas GPU %s, DRAM %s, NVMe %s%s\n", id, label, seconds,
      FormatBytes(quota.gpu_bytes), FormatBytes(quota.dram_bytes), FormatBytes(quota.nvme_bytes), dram);
  std::fputs(line.c_str(), stderr);
}

absl::StatusOr<ipc::HelloGrant> Daemon::OnHello(const ipc::PeerCredentials& peer, const v1::HelloRequest& request) {
  if (request.observer()) {
    // A token and nothing else: the peer's uid was checked by the hello server.
    if (observers_.size() >= kObserversMax) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("tierd serves at most %d observers (tierctl, watchers) at once", kObserversMax));
    }
    auto token = RandomToken();
    if (!token.ok()) return token.status();
    const SessionId id = next_observer_++;
    observers_.insert(id);
    directory_->Add(id, *token);
    ipc::HelloGrant grant;
    grant.session_id = id;
    grant.reply.set_session_id(id);
    grant.reply.set_token(*token);
    grant.reply.set_grpc_address(grpc_address_);
    grant.reply.set_fake_gpu(gpu_.device->is_fake());
    return grant;
  }
  if (rings_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "tierd serves at most %d sessions at once (limits.sessions in its config)", options_.max_sessions));
  }
  SessionQuota quota{request.gpu_bytes(), request.dram_bytes(), request.nvme_bytes()};
  if (quota.gpu_bytes == 0 && quota.dram_bytes == 0 && quota.nvme_bytes == 0) {
    quota = options_.default_quota;
  }
  const std::string label = absl::StrFormat("%s-%d-%d", SafeLabel(request.label()), peer.pid, ++hellos_);
  auto token = RandomToken();
  if (!token.ok()) return token.status();
  const auto opening = std::chrono::steady_clock::now();
  auto session = leases_->OpenSession(label, quota);
  if (!session.ok()) return session.status();
  LogSessionOpened(*session, label, quota,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - opening).count());
  ipc::HelloGrant grant;
  grant.session_id = *session;
  v1::HelloReply& reply = grant.reply;
  reply.set_session_id(*session);
  reply.set_token(*token);
  reply.set_grpc_address(grpc_address_);
  reply.set_fake_gpu(gpu_.device->is_fake());
  const ArenaId dram = leases_->SessionArena(*session, Tier::kDram);
  if (dram != kNoArena) {
    reply.set_dram_arena_id(dram);
    reply.set_dram_arena_bytes(store_->dram_segment(dram)->bytes());
    grant.fds.push_back(store_->dram_segment(dram)->fd());
  }
  const ArenaId gpu = leases_->SessionArena(*session, Tier::kGpu);
  if (gpu != kNoArena) {
    auto exported = store_->gpu_region(gpu)->Export();
    if (!exported.ok()) {
      leases_->CloseSession(*session).IgnoreError();
      return exported.status();
    }
    reply.set_gpu_arena_id(gpu);
    reply.set_gpu_arena_bytes(store_->gpu_region(gpu)->bytes());
    reply.set_gpu_pointer_export(std::string(exported->pointer_data.begin(), exported->pointer_data.end()));
    grant.fds.push_back(exported->pool_fd);
    grant.fds_to_close.push_back(exported->pool_fd);
  }
  // The session's rings, as many as asked (one at least, limits::kRingsPerSessionMax at most).
  static_assert(2 + limits::kRingsPerSessionMax <= ipc::kFrameFdsMax, "the hello's answer carries every ring");
  const uint32_t ring_count = std::clamp<uint32_t>(request.rings(), 1, limits::kRingsPerSessionMax);
  std::vector<int> ring_fds;
  std::vector<ipc::RingSegment*> ring_segments;
  auto drop_rings = [&] {
    for (ipc::RingSegment* segment : ring_segments) ipc::UnmapRingSegment(segment);
    for (int fd : ring_fds) close(fd);
  };
  for (uint32_t r = 0; r < ring_count; ++r) {
    auto ring_fd = ipc::CreateRingSegment();
    auto ring = ring_fd.ok() ? ipc::MapRingSegment(*ring_fd) : absl::StatusOr<ipc::RingSegment*>(ring_fd.status());
    if (ring_fd.ok()) ring_fds.push_back(*ring_fd);
    if (!ring.ok()) {
      drop_rings();
      leases_->CloseSession(*session).IgnoreError();
      return ring.status();
    }
    ring_segments.push_back(*ring);
  }
  const SessionId id = *session;
  std::vector<std::unique_ptr<ImportedEvent>>& events = release_events_[id];
  if (!gpu_.device->is_fake()) {
    for (const std::string& handle : request.release_events()) {
      auto event = gpu_.device->ImportEvent(handle);
      if (!event.ok()) {
        release_events_.erase(id);
        drop_rings();
        leases_->CloseSession(id).IgnoreError();
        return absl::Status(event.status().code(),
                            "opening the client's release event: " + std::string(event.status().message()));
      }
      events.push_back(std::move(*event));
    }
  }
  std::vector<std::unique_ptr<ipc::RingServer>>& servers = rings_[id];
  for (ipc::RingSegment* segment : ring_segments) {  // each server unmaps its segment when it stops
    servers.push_back(std::make_unique<ipc::RingServer>(
        segment,
        [this, id, &events](const ipc::RingMessage& request, std::string* error) {
          return ServeRing(id, events, request, error);
        },
        [label](const absl::Status& why) {
          std::fprintf(stderr, "tierd: session %s: hot-path ring broken (%s); it is no longer served\n", label.c_str(),
                       std::string(why.message()).c_str());
        }));
  }
  reply.set_has_ring(true);
  reply.set_rings(ring_count);
  for (int fd : ring_fds) {
    grant.fds.push_back(fd);
    grant.fds_to_close.push_back(fd);
  }
  directory_->Add(*session, *token);
  return grant;
}

ipc::RingMessage Daemon::ServeRing(SessionId session, const std::vector<std::unique_ptr<ImportedEvent>>& events,
                                   const ipc::RingMessage& message, std::string* error) {
  ipc::RingMessage response = message;
  auto request = ipc::FromRing(message);
  if (!request.ok()) {
    ipc::AnswerOnRing(request.status(), &response, error);
    return response;
  }
  auto fence = ReleaseFence(events, request->release_event);
  if (!fence.ok()) {
    ipc::AnswerOnRing(fence.status(), &response, error);
    return response;
  }
  ipc::AnswerOnRing(ipc::Serve(*hot_path_, session, *request, std::move(*fence)), &response, error);
  return response;
}

absl::StatusOr<std::unique_ptr<GpuFence>> Daemon::ReleaseFence(const std::vector<std::unique_ptr<ImportedEvent>>& events,
                                                                uint64_t event) {
  if (event == 0) return nullptr;
  if (event > events.size()) return absl::InvalidArgumentError("release names an event the session did not share");
  const auto fence_start = std::chrono::steady_clock::now();
  auto made = gpu_.device->FenceAfter(*events[event - 1]);
  fences_.fetch_add(1, std::memory_order_relaxed);
  fence_nanos_.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - fence_start).count(),
      std::memory_order_relaxed);
  return made;
}

std::string Daemon::HotPathSummary() const {
  const int64_t fences = fences_.load();
  const LeaseStats l = leases_->Stats();
  const BounceStats bounced = mover_->Bounced();
  const double n = static_cast<double>(std::max<uint64_t>(l.releases, 1));
  return absl::StrFormat(
             "hot path served: %s; GPU fences for ring releases %d x %.1f us; a release in the lease table %.1f us, of "
             "it "
             "%.1f us for the session's lock, and %d waits for an older fence (%.1f ms in all)",
             hot_path_->times().Describe(), fences, fences > 0 ? fence_nanos_.load() * 1e-3 / fences : 0.0,
             l.release_nanos * 1e-3 / n, l.release_lock_nanos * 1e-3 / n, l.fence_waits,
             l.release_fence_wait_nanos * 1e-6) +
         absl::StrFormat(
             "; the sessions' locks held by acquires %.0f ms (at most %.0f us at once), releases %.0f ms "
             "(%.0f us), planned loads %.0f ms (%.0f us), planned moves away %.0f ms (%.0f us), other %.0f "
             "ms (%.0f us)",
             l.held_nanos[0] * 1e-6, l.held_max_nanos[0] * 1e-3, l.held_nanos[1] * 1e-6, l.held_max_nanos[1] * 1e-3,
             l.held_nanos[2] * 1e-6, l.held_max_nanos[2] * 1e-3, l.held_nanos[3] * 1e-6, l.held_max_nanos[3] * 1e-3,
             l.held_nanos[4] * 1e-6, l.held_max_nanos[4] * 1e-3) +
         absl::StrFormat("; joining free space within the GPU %.0f ms, within DRAM %.0f ms (%d and %d copies moved; "
                         "%d of the GPU's through host memory, %s)",
                         l.relocate_nanos[0] * 1e-6, l.relocate_nanos[1] * 1e-6, l.gpu_relocations, l.relocations,
                         bounced.moves, FormatBytes(bounced.bytes)) +
         // Why the GPU fragments: a planned copy whose layout range was still taken goes elsewhere.
         absl::StrFormat("; copies placed at the plan's layout offset %d, off it (the range still taken) %d (held "
                         "by a copy off the layout %d, by one there ahead of its time %d, by the tensor planned "
                         "there for a placement that does not wait %d, by a move in flight %d), planned loads that "
                         "waited for their range %d; settling into the layout moved %d copies to their offsets "
                         "and %d out of the GPU; demand fetches %d",
                         l.planned_placements, l.off_plan_placements, l.off_plan_by[0], l.off_plan_by[1],
                         l.off_plan_by[2], l.off_plan_by[3], l.layout_waits, l.settle_moves, l.settle_demotes,
                         l.stalls);
}

void Daemon::OnGoodbye(uint64_t session_id) {
  if (observers_.erase(session_id) > 0) {
    directory_->Remove(session_id);
    return;
  }
  rings_.erase(session_id);  // stops serving before the session's tensors go
  {
    absl::MutexLock lock(&recorders_mutex_);
    recorders_.erase(session_id);
    RecordersChanged();
  }
  std::shared_ptr<PlannedSession> planned;
  {
    absl::MutexLock lock(&planned_mutex_);
    if (auto it = planned_.find(session_id); it != planned_.end()) {
      planned = std::move(it->second);
      planned_.erase(it);
    }
  }
  const bool had_plan = planned != nullptr;
  if (had_plan) {
    // What the plan predicted beside what happened (replans, late loads, moves for room), in
    // the log where a run's other figures are: the session and its `tierctl plan` are gone.
    for (absl::string_view line : absl::StrSplit(planned->Summary(), '\n', absl::SkipEmpty())) {
      std::fprintf(stderr, "tierd: session %lu's plan at its end: %.*s\n", static_cast<unsigned long>(session_id),
                   static_cast<int>(line.size()), line.data());
    }
    planned.reset();  // stops its executor (it calls into the session)
  }
  release_events_.erase(session_id);
  directory_->Remove(session_id);
  service_->SessionEnded(session_id);
  leases_->CloseSession(session_id).IgnoreError();
  // A plan's tables can be hundreds of MB; malloc keeps freed memory in its arenas unless
  // asked, so a daemon that planned a big graph once would stay that large.
  if (had_plan) malloc_trim(0);
}

}  // namespace tierd
