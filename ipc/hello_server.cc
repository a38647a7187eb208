#include "ipc/hello_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "absl/strings/str_format.h"

namespace tierd::ipc {
namespace {

void Refuse(int fd, absl::StatusCode code, const std::string& message) {
  tierd::v1::HelloReply reply;
  reply.set_code(static_cast<int>(code));
  reply.set_message(message);
  SendFrame(fd, reply.SerializeAsString()).IgnoreError();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HelloServer>> HelloServer::Start(const std::string& path,
                                                                std::set<uid_t> allowed_uids,
                                                                HelloHandler& handler) {
  if (allowed_uids.empty()) allowed_uids.insert(getuid());
  auto listen_fd = ListenUnix(path, 0600);
  if (!listen_fd.ok()) return listen_fd.status();
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    close(*listen_fd);
    return absl::InternalError("pipe2 failed");
  }
  std::unique_ptr<HelloServer> server(
      new HelloServer(path, *listen_fd, wake[0], wake[1], std::move(allowed_uids), handler));
  server->thread_ = std::thread([s = server.get()] { s->Run(); });
  return server;
}

HelloServer::~HelloServer() {
  stopping_ = true;
  const char byte = 1;
  (void)!write(wake_write_, &byte, 1);
  thread_.join();
  for (auto& [fd, session] : sessions_) {
    handler_.OnGoodbye(session);
    close(fd);
  }
  for (auto& [fd, deadline] : pending_) close(fd);
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
  unlink(path_.c_str());
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

void HelloServer::Accept() {
  const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) return;
  auto peer = GetPeerCredentials(fd);
  if (!peer.ok()) {
    close(fd);
    return;
  }
  // A uid that is not allowed is refused once its hello has arrived, not at once: a reply
  // before the client finished sending made it fail with EPIPE instead of the reason.
  pending_[fd] = {NowMs() + kHelloTimeoutMs, std::make_unique<FrameAssembly>()};  // greeted when whole
}

void HelloServer::Read(int fd) {
  auto it = pending_.find(fd);
  if (it == pending_.end()) return;
  auto whole = it->second.hello->ReadAvailable(fd);
  if (whole.ok() && !*whole) return;  // more to come (or the deadline)
  if (!whole.ok()) {
    Refuse(fd, whole.status().code(), std::string(whole.status().message()));
    close(fd);
    pending_.erase(it);
    return;
  }
  Frame frame = it->second.hello->Take();
  pending_.erase(it);
  Greet(fd, std::move(frame));
}

void HelloServer::Greet(int fd, Frame hello) {
  for (int received : hello.fds) close(received);  // clients send none
  auto peer = GetPeerCredentials(fd);
  if (!peer.ok()) {
    close(fd);
    return;
  }
  if (allowed_uids_.count(peer->uid) == 0) {
    Refuse(fd, absl::StatusCode::kPermissionDenied,
           absl::StrFormat("uid %d may not use this tierd (security.allowed_uids in its config)", peer->uid));
    close(fd);
    return;
  }
  tierd::v1::HelloRequest request;
  if (!request.ParseFromString(hello.payload)) {
    Refuse(fd, absl::StatusCode::kInvalidArgument, "the hello is not a HelloRequest");
    close(fd);
    return;
  }
  if (request.protocol_version() != kProtocolVersion) {
    Refuse(fd, absl::StatusCode::kFailedPrecondition,
           absl::StrFormat("protocol version %d asked, this tierd speaks %d",
                           request.protocol_version(), kProtocolVersion));
    close(fd);
    return;
  }
  auto grant = handler_.OnHello(*peer, request);
  if (!grant.ok()) {
    Refuse(fd, grant.status().code(), std::string(grant.status().message()));
    close(fd);
    return;
  }
  absl::Status sent = SendFrame(fd, grant->reply.SerializeAsString(), grant->fds);
  for (int owned : grant->fds_to_close) close(owned);
  if (!sent.ok()) {
    handler_.OnGoodbye(grant->session_id);
    close(fd);
    return;
  }
  sessions_[fd] = grant->session_id;
  connected_ = sessions_.size();
}

void HelloServer::Run() {
  while (!stopping_) {
    std::vector<pollfd> fds = {{wake_read_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const auto& [fd, pending] : pending_) fds.push_back({fd, POLLIN, 0});
    const size_t first_session = fds.size();
    for (const auto& [fd, session] : sessions_) fds.push_back({fd, POLLIN, 0});
    int64_t wait_ms = -1;
    for (const auto& [fd, pending] : pending_) {
      const int64_t left = pending.deadline_ms - NowMs();
      wait_ms = wait_ms < 0 ? left : std::min(wait_ms, left);
    }
    if (poll(fds.data(), fds.size(), wait_ms < 0 ? -1 : static_cast<int>(std::max<int64_t>(wait_ms, 0))) < 0) {
      continue;  // EINTR
    }
    if (fds[0].revents != 0) break;
    for (size_t i = 2; i < first_session; ++i) {
      if (fds[i].revents != 0) Read(fds[i].fd);
    }
    for (size_t i = first_session; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      // A session connection is silent until it closes: EOF, an error or stray bytes
      // all end the session.
      const int fd = fds[i].fd;
      handler_.OnGoodbye(sessions_[fd]);
      sessions_.erase(fd);
      close(fd);
      connected_ = sessions_.size();
    }
    if (fds[1].revents & POLLIN) Accept();
    // Silent connections past their deadline go.
    const int64_t now = NowMs();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline_ms > now) {
        ++it;
        continue;
      }
      Refuse(it->first, absl::StatusCode::kDeadlineExceeded, "no hello within the time allowed");
      close(it->first);
      it = pending_.erase(it);
    }
  }
}

}  // namespace tierd::ipc
