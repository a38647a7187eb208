#include "clients/client.h"

#include <chrono>

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/limits.h"
#include "base/units.h"
#include "ipc/hello_server.h"
#include "ipc/hot_path_wire.h"
#include "ipc/proto_convert.h"
#include "ipc/unix_socket.h"

#ifdef TIERD_HAVE_CUDA
#include <cuda_runtime.h>

#include "ipc/gpu_import.h"
#endif

namespace tierd {

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  const std::string path = options.runtime_dir + "/tierd.sock";
  auto fd = ipc::ConnectUnix(path);
  if (!fd.ok()) {
    return absl::UnavailableError(absl::StrFormat(
        "cannot reach tierd at %s (%s): is it running with --runtime_dir=%s?", path,
        fd.status().message(), options.runtime_dir));
  }
  std::unique_ptr<Client> client(new Client());
  client->hello_fd_ = *fd;
  client->socket_path_ = path;
  v1::HelloRequest request;
  request.set_protocol_version(ipc::kProtocolVersion);
  request.set_label(options.label);
  request.set_gpu_bytes(options.quota.gpu_bytes);
  request.set_dram_bytes(options.quota.dram_bytes);
  request.set_nvme_bytes(options.quota.nvme_bytes);
  request.set_observer(options.observer);
  request.set_rings(static_cast<uint32_t>(std::clamp<int>(options.rings, 1, limits::kRingsPerSessionMax)));
#ifdef TIERD_HAVE_CUDA
  int devices = 0;
  if (options.use_ring && !options.observer && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
    for (int i = 0; i < 32; ++i) {
      cudaEvent_t event;
      cudaIpcEventHandle_t handle;
      if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming | cudaEventInterprocess) != cudaSuccess) break;
      if (cudaIpcGetEventHandle(&handle, event) != cudaSuccess) {
        cudaEventDestroy(event);
        break;
      }
      client->release_events_.push_back(event);
      request.add_release_events(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    }
  }
#endif
  if (absl::Status sent = ipc::SendFrame(*fd, request.SerializeAsString()); !sent.ok()) return sent;
  // tierd reserves the session's DRAM quota in shared memory and pins it for the GPU before
  // it answers: a few GB/s, so a large quota takes a while (100 GiB: about half a minute).
  const uint64_t dram_gib = options.quota.dram_bytes >> 30;
  const int timeout_ms = static_cast<int>(std::min<uint64_t>(30'000 + 1'000 * dram_gib, 600'000));
  auto frame = ipc::ReceiveFrame(*fd, timeout_ms);
  if (!frame.ok()) {
    if (!absl::IsDeadlineExceeded(frame.status())) return frame.status();
    return absl::DeadlineExceededError(absl::StrFormat(
        "tierd at %s did not answer the hello within %d s (it reserves and pins the session's DRAM quota of %s "
        "first; is it stuck, or the quota beyond what /dev/shm can give quickly?)",
        options.runtime_dir, timeout_ms / 1000, FormatBytes(options.quota.dram_bytes)));
  }
  v1::HelloReply reply;
  if (!reply.ParseFromString(frame->payload)) {
    for (int f : frame->fds) close(f);
    return absl::InternalError("tierd answered the hello with something that is not a HelloReply");
  }
  if (reply.code() != 0) {
    for (int f : frame->fds) close(f);
    return absl::Status(static_cast<absl::StatusCode>(reply.code()), "tierd refused the session: " + reply.message());
  }
  client->session_id_ = reply.session_id();
  client->token_ = reply.token();
  client->fake_gpu_ = reply.fake_gpu();
  absl::Status mapped = client->MapArenas(reply, frame->fds);
  if (mapped.ok() && reply.has_ring() && options.use_ring) {
    const size_t first_ring = (reply.dram_arena_bytes() > 0) + (reply.gpu_arena_bytes() > 0);
    const size_t rings = std::max<uint32_t>(reply.rings(), 1);
    if (first_ring + rings > frame->fds.size()) {
      mapped = absl::InternalError(absl::StrFormat("tierd announced %d rings but sent descriptors for %d", rings,
                                                   frame->fds.size() - std::min(first_ring, frame->fds.size())));
    }
    for (size_t r = 0; mapped.ok() && r < rings; ++r) {
      auto ring = ipc::MapRingSegment(frame->fds[first_ring + r]);
      if (!ring.ok()) {
        mapped = ring.status();
        break;
      }
      client->lanes_.push_back(std::make_unique<Lane>());
      client->lanes_.back()->ring = *ring;
      client->lanes_.back()->index = static_cast<int>(r);
    }
  }
  for (int f : frame->fds) close(f);
  if (!mapped.ok()) return mapped;
  client->stub_ = v1::Tierd::NewStub(
      grpc::CreateChannel(reply.grpc_address(), grpc::InsecureChannelCredentials()));
  return client;
}

absl::Status Client::MapArenas(const v1::HelloReply& reply, std::vector<int>& fds) {
  size_t next = 0;
  if (reply.dram_arena_bytes() > 0) {
    if (next >= fds.size()) return absl::InternalError("tierd sent no DRAM segment descriptor");
    void* base = mmap(nullptr, reply.dram_arena_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fds[next++], 0);
    if (base == MAP_FAILED) return absl::InternalError(absl::StrFormat("mapping the DRAM arena: %s", std::strerror(errno)));
    dram_base_ = static_cast<uint8_t*>(base);
    dram_bytes_ = reply.dram_arena_bytes();
    dram_arena_ = reply.dram_arena_id();
  }
  if (reply.gpu_arena_bytes() > 0) {
    if (next >= fds.size()) return absl::InternalError("tierd sent no GPU arena descriptor");
    gpu_bytes_ = reply.gpu_arena_bytes();
    gpu_arena_ = reply.gpu_arena_id();
    if (fake_gpu_) {
      void* base = mmap(nullptr, gpu_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fds[next], 0);
      if (base == MAP_FAILED) return absl::InternalError(absl::StrFormat("mapping the fake GPU arena: %s", std::strerror(errno)));
      gpu_base_ = static_cast<uint8_t*>(base);
    } else {
#ifdef TIERD_HAVE_CUDA
      GpuRegionExport exported;
      exported.pool_fd = dup(fds[next]);  // ImportGpuRegion takes ownership
      std::memcpy(exported.pointer_data.data(), reply.gpu_pointer_export().data(),
                  std::min(reply.gpu_pointer_export().size(), exported.pointer_data.size()));
      auto base = ImportGpuRegion(0, exported);
      if (!base.ok()) return base.status();
      gpu_base_ = static_cast<uint8_t*>(*base);
#else
      return absl::FailedPreconditionError(
          "tierd has a real GPU, but this client was built without CUDA and cannot map it");
#endif
    }
  }
  return absl::OkStatus();
}

Client::~Client() {
#ifdef TIERD_HAVE_CUDA
  for (void* event : release_events_) cudaEventDestroy(static_cast<cudaEvent_t>(event));
#endif
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    lane->ring->closed.store(1);
    ipc::RingWake(lane->ring->requests);
    ipc::UnmapRingSegment(lane->ring);
  }
  if (gpu_base_ != nullptr) {
    if (fake_gpu_) munmap(gpu_base_, gpu_bytes_);
#ifdef TIERD_HAVE_CUDA
    else ReleaseImportedGpuRegion(gpu_base_).IgnoreError();
#endif
  }
  if (dram_base_ != nullptr) munmap(dram_base_, dram_bytes_);
  if (hello_fd_ >= 0) close(hello_fd_);  // tierd ends the session
}

absl::Status Client::TensorCall(TensorMethod method, const Tensor& tensor) {
  v1::TensorRef request;
  *request.mutable_session() = Ref();
  request.set_tensor_id(tensor.id);
  v1::Empty reply;
  grpc::ClientContext context;
  return Checked((stub_.get()->*method)(&context, request, &reply));
}

v1::SessionRef Client::Ref() const {
  v1::SessionRef ref;
  ref.set_session_id(session_id_);
  ref.set_token(token_);
  return ref;
}

absl::StatusOr<Client::Tensor> Client::Lease(const TensorSpec& spec) {
  // Checked here too: a name that is not UTF-8 could not even be put on the wire.
  if (absl::Status valid = ValidateTensorSpec(spec).status(); !valid.ok()) return valid;
  v1::LeaseRequest request;
  *request.mutable_session() = Ref();
  *request.mutable_spec() = ipc::ToProto(spec);
  v1::LeaseReply reply;
  grpc::ClientContext context;
  if (absl::Status s = Checked(stub_->Lease(&context, request, &reply)); !s.ok()) return s;
  return Tensor{reply.tensor_id(), reply.bytes(), spec.name};
}

absl::Status Client::Unlease(const Tensor& tensor) {
  return TensorCall(&v1::Tierd::Stub::Unlease, tensor);
}

bool Client::SessionOpen() {
  if (lost_.load(std::memory_order_relaxed)) return false;
  // After the hello tierd sends nothing on this socket: readable or hung up means closed.
  pollfd p{hello_fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) == 0) return true;
  char byte;
  const bool open = (p.revents & (POLLHUP | POLLRDHUP | POLLERR | POLLNVAL)) == 0 &&
                    recv(hello_fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
  if (!open) lost_.store(true);
  return open;
}

absl::Status Client::SessionLost() const {
  return absl::UnavailableError(absl::StrFormat(
      "tierd closed session %d: its socket %s hung up (tierd died, was stopped, or ended the session); the "
      "tensors it held for this session are gone",
      session_id_, socket_path_));
}

absl::Status Client::Checked(const grpc::Status& status) {
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !SessionOpen()) return SessionLost();
  return ipc::FromGrpc(status);
}

Client::Lane& Client::TakeLane() {
  const size_t n = lanes_.size();
  const size_t own = std::hash<std::thread::id>{}(std::this_thread::get_id()) % n;
  for (size_t k = 0; k < n; ++k) {
    Lane& lane = *lanes_[(own + k) % n];
    if (lane.mutex.TryLock()) return lane;
  }
  lanes_[own]->mutex.Lock();
  return *lanes_[own];
}

absl::StatusOr<ipc::RingMessage> Client::RingCall(const ipc::RingMessage& request) {
  return std::move(RingCalls({request})[0]);
}

std::vector<absl::StatusOr<ipc::RingMessage>> Client::RingCalls(const std::vector<ipc::RingMessage>& requests)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Lane& lane = TakeLane();
  std::vector<absl::StatusOr<ipc::RingMessage>> answers = RingCallsOn(lane, requests);
  lane.mutex.Unlock();
  return answers;
}

std::vector<absl::StatusOr<ipc::RingMessage>> Client::RingCallsOn(Lane& lane,
                                                                  const std::vector<ipc::RingMessage>& requests) {
  std::vector<absl::StatusOr<ipc::RingMessage>> answers;
  answers.reserve(requests.size());
  if (!SessionOpen()) {
    while (answers.size() < requests.size()) answers.push_back(SessionLost());
    return answers;
  }
  for (size_t first = 0; first < requests.size(); first += ipc::kRingSlots) {
    const size_t count = std::min<size_t>(ipc::kRingSlots, requests.size() - first);
    const auto start = std::chrono::steady_clock::now();
    const uint64_t first_sequence = lane.sequence + 1;
    size_t pushed = 0;
    for (; pushed < count; ++pushed) {
      ipc::RingMessage message = requests[first + pushed];
      message.sequence = first_sequence + pushed;
      if (!ipc::RingPush(lane.ring->requests, message)) break;
      lane.sequence = message.sequence;
    }
    // Every pushed request is answered before the next exchange (the rings stay in step).
    for (size_t k = 0; k < count; ++k) {
      answers.push_back(k < pushed ? RingAnswer(lane, first_sequence + k)
                                   : absl::InternalError("the hot-path ring is full: tierd stopped serving this session"));
    }
    // Each request's share of the exchange, by kind.
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / count;
    absl::MutexLock times_lock(&times_mutex_);
    for (size_t k = 0; k < count; ++k) {
      const uint32_t op = requests[first + k].op;
      RingTimes& t = ring_times_;
      if (op == static_cast<uint32_t>(ipc::RingOp::kAcquire)) ++t.acquires, t.acquire_seconds += s;
      if (op == static_cast<uint32_t>(ipc::RingOp::kRelease)) ++t.releases, t.release_seconds += s;
      if (op == static_cast<uint32_t>(ipc::RingOp::kOpBegin)) ++t.op_begins, t.op_begin_seconds += s;
    }
  }
  return answers;
}

absl::StatusOr<ipc::RingMessage> Client::RingAnswer(Lane& lane, uint64_t sequence) {
  if (lost_.load()) return SessionLost();
  // Waits as long as the operation takes (a demand fetch from NVMe can take seconds), but
  // not for a tierd that died: SIGKILL leaves the ring's closed flag unset, the socket tells.
  for (;;) {
    auto answer = ipc::RingPop(lane.ring->responses, lane.ring->closed, limits::kClientSessionCheckMs);
    if (answer.ok()) {
      if (answer->sequence != sequence) return absl::InternalError("ring answers out of order");
      if (answer->code == 0) return *answer;
      // Refused: why is in the segment, beside the answer (read under the lock, before
      // another request can reuse its slot).
      const int code = answer->code;
      return absl::Status(code > 0 && code <= 16 ? static_cast<absl::StatusCode>(code) : absl::StatusCode::kUnknown,
                          ipc::RingErrorText(*lane.ring, sequence));
    }
    if (absl::IsUnavailable(answer.status())) {  // tierd set the ring's closed flag
      lost_.store(true);
      return SessionLost();
    }
    if (!absl::IsDeadlineExceeded(answer.status())) return answer.status();
    if (!SessionOpen()) return SessionLost();
  }
}

absl::StatusOr<void*> Client::PointerFor(const Tensor& tensor, Place place, uint64_t arena,
                                         uint64_t offset, uint64_t bytes) const {
  const bool gpu = place == Place::kGpu;
  uint8_t* base = gpu ? gpu_base_ : dram_base_;
  const uint64_t mine = gpu ? gpu_arena_ : dram_arena_;
  const uint64_t size = gpu ? gpu_bytes_ : dram_bytes_;
  if (base == nullptr || arena != mine || offset + bytes > size) {
    return absl::InternalError(absl::StrFormat(
        "tierd placed '%s' at arena %d offset %d, outside this session's mapping", tensor.name,
        arena, offset));
  }
  return static_cast<void*>(base + offset);
}

absl::StatusOr<void*> Client::Acquire(const Tensor& tensor, Access access, Place place) {
  if (lanes_.empty()) return AcquireRpc(tensor, access, place);
  auto answer = RingCall(ipc::ToRing(
      {.kind = ipc::HotPathKind::kAcquire, .tensor = tensor.id, .access = access, .place = place}));
  if (!answer.ok()) return answer.status();
  return PointerFor(tensor, place, answer->arena, answer->offset, answer->bytes);
}

absl::Status Client::Release(const Tensor& tensor, void* cuda_stream) {
  return ReleaseAll({&tensor}, cuda_stream);
}

Client::RingTimes Client::ring_times() const {
  absl::MutexLock lock(&times_mutex_);
  return ring_times_;
}

absl::Status Client::Release(const Tensor& tensor) { return ReleaseAll({&tensor}); }

absl::StatusOr<std::vector<void*>> Client::AcquireAll(const std::vector<AcquireItem>& items, Place place) {
  std::vector<void*> pointers(items.size(), nullptr);
  std::vector<absl::StatusOr<void*>> got;
  got.reserve(items.size());
  if (lanes_.empty()) {
    for (const AcquireItem& item : items) {
      got.push_back(AcquireRpc(*item.tensor, item.access, place));
      if (!got.back().ok()) break;  // nothing more asked: the rest would be released again
    }
  } else {
    std::vector<ipc::RingMessage> requests;
    requests.reserve(items.size());
    for (const AcquireItem& item : items) {
      requests.push_back(ipc::ToRing(
          {.kind = ipc::HotPathKind::kAcquire, .tensor = item.tensor->id, .access = item.access, .place = place}));
    }
    std::vector<absl::StatusOr<ipc::RingMessage>> answers = RingCalls(requests);
    for (size_t k = 0; k < answers.size(); ++k) {
      if (!answers[k].ok()) {
        got.push_back(answers[k].status());
        continue;
      }
      got.push_back(PointerFor(*items[k].tensor, place, answers[k]->arena, answers[k]->offset, answers[k]->bytes));
      if (!got.back().ok()) {  // granted, but unusable here: tierd still counts it acquired
        (void)Release(*items[k].tensor);
      }
    }
  }
  absl::Status first = absl::OkStatus();
  std::vector<const Tensor*> granted;
  for (size_t k = 0; k < got.size(); ++k) {
    if (got[k].ok()) {
      pointers[k] = *got[k];
      granted.push_back(items[k].tensor);
    } else if (first.ok()) {
      first = got[k].status();
    }
  }
  if (first.ok()) return pointers;
  (void)ReleaseAll(granted);  // all or none
  return first;
}

absl::Status Client::ReleaseAll(const std::vector<const Tensor*>& tensors, void* cuda_stream)
    ABSL_NO_THREAD_SAFETY_ANALYSIS {
#ifdef TIERD_HAVE_CUDA
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  if (!lanes_.empty() && !fake_gpu_ && release_events_.size() >= lanes_.size()) {
    if (tensors.empty()) return absl::OkStatus();
    Lane& lane = TakeLane();
    // The lane's own events (lane.index + k * lanes): none is recorded again before tierd has
    // answered the release that names it, since the lane is held until then.
    const size_t own = (release_events_.size() - lane.index + lanes_.size() - 1) / lanes_.size();
    const uint32_t index = lane.index + (lane.next_release_event++ % own) * lanes_.size();
    const auto start = std::chrono::steady_clock::now();
    const cudaError_t recorded = cudaEventRecord(static_cast<cudaEvent_t>(release_events_[index]), stream);
    {
      absl::MutexLock times_lock(&times_mutex_);
      ring_times_.event_record_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    absl::Status released = recorded == cudaSuccess
                                ? ReleaseOnRing(lane, tensors, index + 1)
                                : absl::InternalError("recording the release event on the stream failed");
    lane.mutex.Unlock();
    return released;
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    return absl::InternalError("synchronising the stream before the release failed");
  }
#else
  (void)cuda_stream;
#endif
  return ReleaseAll(tensors);
}

absl::Status Client::ReleaseAll(const std::vector<const Tensor*>& tensors) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (!lanes_.empty()) {
    Lane& lane = TakeLane();
    absl::Status released = ReleaseOnRing(lane, tensors, 0);
    lane.mutex.Unlock();
    return released;
  }
  absl::Status first = absl::OkStatus();
  for (const Tensor* tensor : tensors) first.Update(ReleaseRpc(*tensor));
  return first;
}

absl::Status Client::ReleaseOnRing(Lane& lane, const std::vector<const Tensor*>& tensors, uint64_t release_event) {
  std::vector<ipc::RingMessage> requests;
  requests.reserve(tensors.size());
  for (const Tensor* tensor : tensors) {
    requests.push_back(
        ipc::ToRing({.kind = ipc::HotPathKind::kRelease, .tensor = tensor->id, .release_event = release_event}));
  }
  absl::Status first = absl::OkStatus();
  for (const auto& answer : RingCallsOn(lane, requests)) first.Update(answer.status());
  return first;
}

absl::StatusOr<void*> Client::AcquireRpc(const Tensor& tensor, Access access, Place place) {
  v1::AcquireRequest request = ipc::ToAcquireRequest(
      {.kind = ipc::HotPathKind::kAcquire, .tensor = tensor.id, .access = access, .place = place});
  *request.mutable_session() = Ref();
  v1::AcquireReply reply;
  grpc::ClientContext context;
  if (absl::Status s = Checked(stub_->Acquire(&context, request, &reply)); !s.ok()) return s;
  return PointerFor(tensor, place, reply.arena_id(), reply.offset(), reply.bytes());
}

absl::Status Client::ReleaseRpc(const Tensor& tensor) {
  return TensorCall(&v1::Tierd::Stub::Release, tensor);
}

absl::StatusOr<v1::PlanReply> Client::RegisterGraph(const v1::GraphSpec& graph) {
  v1::RegisterGraphRequest request;
  *request.mutable_session() = Ref();
  *request.mutable_graph() = graph;
  v1::PlanReply reply;
  grpc::ClientContext context;
  if (absl::Status s = Checked(stub_->RegisterGraph(&context, request, &reply)); !s.ok()) return s;
  return reply;
}

absl::StatusOr<v1::PlanReply> Client::MarkIteration() {
  v1::MarkIterationRequest request;
  *request.mutable_session() = Ref();
  v1::PlanReply reply;
  grpc::ClientContext context;
  if (absl::Status s = Checked(stub_->MarkIteration(&context, request, &reply)); !s.ok()) return s;
  return reply;
}

absl::Status Client::ReportStep(int64_t step, double loss, double seconds, double tokens) {
  v1::StepReport request;
  *request.mutable_session() = Ref();
  request.set_step(step);
  request.set_loss(loss);
  request.set_step_seconds(seconds);
  request.set_tokens(tokens);
  v1::Empty reply;
  grpc::ClientContext context;
  return Checked(stub_->ReportStep(&context, request, &reply));
}

absl::Status Client::OpBegin(uint32_t op) {
  if (!lanes_.empty()) {
    return RingCall(ipc::ToRing({.kind = ipc::HotPathKind::kOpBegin, .op = op})).status();
  }
  v1::OpBeginRequest request;
  *request.mutable_session() = Ref();
  request.set_op(op);
  v1::Empty reply;
  grpc::ClientContext context;
  return Checked(stub_->OpBegin(&context, request, &reply));
}

absl::Status Client::Pin(const Tensor& tensor, Tier tier) {
  v1::PinRequest request;
  *request.mutable_session() = Ref();
  request.set_tensor_id(tensor.id);
  request.set_tier(ipc::ToProto(tier));
  v1::Empty reply;
  grpc::ClientContext context;
  return Checked(stub_->Pin(&context, request, &reply));
}

absl::Status Client::Unpin(const Tensor& tensor) {
  return TensorCall(&v1::Tierd::Stub::Unpin, tensor);
}

absl::StatusOr<v1::StatsReply> Client::Stats() {
  v1::Empty request;
  v1::StatsReply reply;
  grpc::ClientContext context;
  if (absl::Status s = Checked(stub_->Stats(&context, request, &reply)); !s.ok()) return s;
  return reply;
}

void Client::AddCallerMetadata(grpc::ClientContext* context) const {
  context->AddMetadata(ipc::kSessionMetadata, std::to_string(session_id_));
  context->AddMetadata(ipc::kTokenMetadata, token_);
}

absl::StatusOr<v1::ListLeasesReply> Client::ListLeases(bool every_session) {
  v1::ListLeasesRequest request;
  request.set_session_id(every_session ? 0 : session_id_);
  v1::ListLeasesReply reply;
  grpc::ClientContext context;
  AddCallerMetadata(&context);
  if (absl::Status s = Checked(stub_->ListLeases(&context, request, &reply)); !s.ok()) return s;
  return reply;
}

absl::StatusOr<v1::SessionUsageReply> Client::Usage(bool reset_peaks) {
  v1::SessionUsageRequest request;
  *request.mutable_session() = Ref();
  request.set_reset_peaks(reset_peaks);
  v1::SessionUsageReply reply;
  grpc::ClientContext context;
  if (absl::Status s = Checked(stub_->SessionUsage(&context, request, &reply)); !s.ok()) return s;
  return reply;
}

}  // namespace tierd
