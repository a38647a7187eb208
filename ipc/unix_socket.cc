#include "ipc/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tierd::ipc {
namespace {

absl::Status Errno(const char* what, int error) {
  return absl::UnavailableError(absl::StrFormat("%s: %s", what, std::strerror(error)));
}

absl::StatusOr<sockaddr_un> Address(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path '%s' must have 1 to %d characters", path, sizeof(address.sun_path) - 1));
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  return address;
}

void CloseAll(const std::vector<int>& fds) {
  for (int fd : fds) close(fd);
}

// Reads exactly `size` bytes, collecting descriptors from the control messages.
absl::Status ReadFully(int fd, char* out, size_t size, int timeout_ms, std::vector<int>* fds,
                       bool* clean_eof) {
  size_t done = 0;
  while (done < size) {
    pollfd p{fd, POLLIN, 0};
    const int ready = poll(&p, 1, timeout_ms);
    if (ready == 0) return absl::DeadlineExceededError("timed out waiting for a frame");
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Errno("poll", errno);
    }
    iovec iov{out + done, size - done};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFrameFdsMax)];
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t got = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Errno("recvmsg", errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds->push_back(received);
      }
    }
    if (message.msg_flags & MSG_CTRUNC) return absl::InvalidArgumentError("too many descriptors in a frame");
    if (got == 0) {
      *clean_eof = done == 0;
      return absl::UnavailableError(done == 0 ? "the peer closed the connection"
                                              : "the peer closed the connection mid-frame");
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> ListenUnix(const std::string& path, mode_t mode) {
  auto address = Address(path);
  if (!address.ok()) return address.status();
  // A live daemon answers a connect; a stale file does not.
  if (auto probe = ConnectUnix(path); probe.ok()) {
    close(*probe);
    return absl::AlreadyExistsError(
        absl::StrFormat("%s is in use by a running process (another tierd?)", path));
  }
  unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", errno);
  const mode_t old_mask = umask(0777 & ~mode);  // the file is born with `mode`, no window
  const int bound = bind(fd, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address));
  const int bind_error = errno;
  umask(old_mask);
  if (bound != 0 || listen(fd, 64) != 0) {
    const int error = bound != 0 ? bind_error : errno;
    close(fd);
    return Errno(("listening on " + path).c_str(), error);
  }
  return fd;
}

absl::StatusOr<int> ConnectUnix(const std::string& path) {
  auto address = Address(path);
  if (!address.ok()) return address.status();
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", errno);
  if (connect(fd, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0) {
    const int error = errno;
    close(fd);
    return Errno(("connecting to " + path).c_str(), error);
  }
  return fd;
}

absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd) {
  ucred credentials{};
  socklen_t length = sizeof(credentials);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) != 0) {
    return Errno("SO_PEERCRED", errno);
  }
  return PeerCredentials{credentials.pid, credentials.uid, credentials.gid};
}

absl::Status SendFrame(int fd, absl::string_view payload, const std::vector<int>& fds) {
  if (payload.size() > kFrameBytesMax || fds.size() > kFrameFdsMax) {
    return absl::InvalidArgumentError("frame too large");
  }
  std::string buffer(4, '\0');
  const uint32_t length = static_cast<uint32_t>(payload.size());
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((length >> (8 * i)) & 0xFF);
  buffer.append(payload.data(), payload.size());
  size_t sent = 0;
  while (sent < buffer.size()) {
    iovec iov{buffer.data() + sent, buffer.size() - sent};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFrameFdsMax)] = {};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {
      message.msg_control = control;
      message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&message);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = sendmsg(fd, &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("sendmsg", errno);
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

FrameAssembly::~FrameAssembly() { CloseAll(fds_); }

absl::StatusOr<bool> FrameAssembly::ReadAvailable(int fd) {
  for (;;) {
    size_t need = 4;
    if (bytes_.size() >= 4) {
      uint32_t length = 0;
      for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<uint8_t>(bytes_[i])) << (8 * i);
      if (length > kFrameBytesMax) {
        return absl::InvalidArgumentError(
            absl::StrFormat("frame of %d bytes announced; at most %d allowed", length, kFrameBytesMax));
      }
      need = 4 + length;
    }
    if (bytes_.size() >= need) return true;
    const size_t have = bytes_.size();
    bytes_.resize(need);
    iovec iov{bytes_.data() + have, need - have};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kFrameFdsMax)] = {};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    const ssize_t n = recvmsg(fd, &message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    const int error = errno;
    bytes_.resize(have + (n > 0 ? static_cast<size_t>(n) : 0));
    for (cmsghdr* c = CMSG_FIRSTHDR(&message); n > 0 && c != nullptr; c = CMSG_NXTHDR(&message, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds_.push_back(received);
      }
    }
    if (fds_.size() > kFrameFdsMax) return absl::InvalidArgumentError("too many descriptors in a frame");
    if (n == 0) return absl::UnavailableError("the peer closed the connection in the middle of a frame");
    if (n < 0) {
      if (error == EINTR) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) return false;
      return Errno("recvmsg", error);
    }
  }
}

Frame FrameAssembly::Take() {
  Frame frame;
  frame.payload = bytes_.size() > 4 ? bytes_.substr(4) : std::string();
  frame.fds = std::move(fds_);
  fds_.clear();
  bytes_.clear();
  return frame;
}

absl::StatusOr<Frame> ReceiveFrame(int fd, int timeout_ms) {
  Frame frame;
  char header[4];
  bool clean_eof = false;
  absl::Status status = ReadFully(fd, header, 4, timeout_ms, &frame.fds, &clean_eof);
  if (status.ok()) {
    uint32_t length = 0;
    for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
    if (length > kFrameBytesMax) {
      status = absl::InvalidArgumentError(
          absl::StrFormat("frame of %d bytes announced; at most %d allowed", length, kFrameBytesMax));
    } else {
      frame.payload.resize(length);
      bool eof = false;
      status = ReadFully(fd, frame.payload.data(), length, timeout_ms, &frame.fds, &eof);
    }
  }
  if (status.ok() && frame.fds.size() > kFrameFdsMax) {
    status = absl::InvalidArgumentError("too many descriptors in a frame");
  }
  if (!status.ok()) {
    CloseAll(frame.fds);
    return status;
  }
  return frame;
}

}  // namespace tierd::ipc
