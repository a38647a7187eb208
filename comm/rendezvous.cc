#include "comm/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"

namespace tierd::comm {
namespace {

using Clock = std::chrono::steady_clock;

// Bytes on the wire: a 4-byte magic, a 4-byte length, the payload.
constexpr uint32_t kMagic = 0x74726476;  // "trdv"
constexpr uint32_t kMaxPayload = 1 << 20;

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

double Seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

// Waits for `events` on fd until the deadline; false on timeout.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) return true;  // the next call reports the error
  }
}

absl::Status SendAll(int fd, const void* data, size_t size, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    if (!WaitFor(fd, POLLOUT, deadline)) return absl::DeadlineExceededError("sending timed out");
    const ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrFormat("send: %s", std::strerror(errno)));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t size, Clock::time_point deadline) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    if (!WaitFor(fd, POLLIN, deadline)) return absl::DeadlineExceededError("reading timed out");
    const ssize_t n = recv(fd, p, size, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n == 0) return absl::UnavailableError("the peer closed the connection early");
    if (n < 0) return absl::UnavailableError(absl::StrFormat("recv: %s", std::strerror(errno)));
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::string Where(const LaunchInfo& launch) {
  if (launch.rendezvous_port == launch.master_port) {
    return absl::StrFormat("MASTER_ADDR:MASTER_PORT = %s:%d", launch.master_addr, launch.master_port);
  }
  return absl::StrFormat("MASTER_ADDR %s, port %d (MASTER_PORT %d is the launcher's; TIERD_RDZV_PORT sets ours)",
                         launch.master_addr, launch.rendezvous_port, launch.master_port);
}

absl::StatusOr<std::string> Serve(const LaunchInfo& launch, const std::string& bytes, const RendezvousOptions& o) {
  const auto t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_seconds));
  Fd listener(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0));
  bool v6 = listener.get() >= 0;
  if (!v6) listener = Fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.get() < 0) return absl::UnavailableError(absl::StrFormat("rank 0: socket: %s", std::strerror(errno)));
  const int one = 1, zero = 0;
  setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc;
  if (v6) {
    setsockopt(listener.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 peers too
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<uint16_t>(launch.rendezvous_port));
    rc = bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(launch.rendezvous_port));
    rc = bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  if (rc != 0 || listen(listener.get(), launch.size) != 0) {
    return absl::UnavailableError(
        absl::StrFormat("rank 0 cannot listen on port %d (%s): %s; another job may hold it: give a free MASTER_PORT "
                        "(or TIERD_RDZV_PORT)",
                        launch.rendezvous_port, Where(launch), std::strerror(errno)));
  }
  std::vector<Fd> peers;
  for (int met = 1; met < launch.size; ++met) {
    if (!WaitFor(listener.get(), POLLIN, deadline)) {
      return absl::DeadlineExceededError(
          absl::StrFormat("rank 0: %d of the other %d ranks came to %s within %.0f s; the rest never did (started "
                          "with the same MASTER_ADDR/MASTER_PORT? still starting?)",
                          met - 1, launch.size - 1, Where(launch), Seconds(t0)));
    }
    Fd peer(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.get() < 0) {
      --met;
      continue;
    }
    const uint32_t header[2] = {kMagic, static_cast<uint32_t>(bytes.size())};
    if (absl::Status s = SendAll(peer.get(), header, sizeof(header), deadline); !s.ok()) return s;
    if (absl::Status s = SendAll(peer.get(), bytes.data(), bytes.size(), deadline); !s.ok()) return s;
    peers.push_back(std::move(peer));
  }
  // Each peer says it has the bytes (one byte back) before rank 0 goes on and closes.
  for (Fd& peer : peers) {
    char ack = 0;
    if (absl::Status s = ReadAll(peer.get(), &ack, 1, deadline); !s.ok()) {
      return absl::UnavailableError(
          absl::StrFormat("rank 0: a rank at %s did not confirm: %s", Where(launch), s.message()));
    }
  }
  return bytes;
}

absl::StatusOr<std::string> Fetch(const LaunchInfo& launch, const RendezvousOptions& o) {
  const auto t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.timeout_seconds));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(launch.rendezvous_port);
  if (int rc = getaddrinfo(launch.master_addr.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("rank %d: MASTER_ADDR=%s does not resolve: %s", launch.rank,
                                                      launch.master_addr, gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);
  std::string last_error = "no address";
  for (int attempt = 0;; ++attempt) {
    for (addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
      Fd fd(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
      if (fd.get() < 0) continue;
      if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      uint32_t header[2] = {0, 0};
      if (absl::Status s = ReadAll(fd.get(), header, sizeof(header), deadline); !s.ok()) {
        last_error = std::string(s.message());
        continue;
      }
      if (header[0] != kMagic || header[1] > kMaxPayload) {
        return absl::DataLossError(
            absl::StrFormat("rank %d: what answers at %s is not a tierd rank 0 (another service on that port?)",
                            launch.rank, Where(launch)));
      }
      std::string bytes(header[1], '\0');
      if (absl::Status s = ReadAll(fd.get(), bytes.data(), bytes.size(), deadline); !s.ok()) return s;
      const char ack = 1;
      if (absl::Status s = SendAll(fd.get(), &ack, 1, deadline); !s.ok()) return s;
      return bytes;
    }
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrFormat("rank %d: no rank 0 at %s after %.0f s (%s): is rank 0 running, and MASTER_ADDR its address?",
                          launch.rank, Where(launch), Seconds(t0), last_error));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(500, 20 * (attempt + 1))));
  }
}

}  // namespace

absl::StatusOr<std::string> ShareFromRankZero(const LaunchInfo& launch, const std::string& bytes,
                                              const RendezvousOptions& options) {
  if (launch.size <= 1) return bytes;
  if (launch.master_addr.empty() || launch.rendezvous_port <= 0 || launch.rendezvous_port > 65535) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d of %d: GPU ranks meet at MASTER_ADDR:MASTER_PORT (torchrun sets them; under mpirun or srun, "
        "export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port>); have '%s' and %d",
        launch.rank, launch.size, launch.master_addr, launch.rendezvous_port));
  }
  if (bytes.size() > kMaxPayload) return absl::InvalidArgumentError("rendezvous payload over 1 MiB");
  return launch.rank == 0 ? Serve(launch, bytes, options) : Fetch(launch, options);
}

}  // namespace tierd::comm
