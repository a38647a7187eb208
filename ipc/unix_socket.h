// Unix-domain stream sockets for the hello plane: listening with safe permissions,
// peer credentials (SO_PEERCRED), and length-prefixed frames that may carry file
// descriptors (SCM_RIGHTS).
//
// Frame: a 4-byte little-endian payload length, then the payload; at most
// kFrameBytesMax bytes and kFrameFdsMax descriptors, which travel with the first byte.
// Anything else (oversized, truncated, too many fds, EOF mid-frame) is an error status,
// never a crash, and received descriptors are closed on every error path.
#ifndef TIERD_IPC_UNIX_SOCKET_H_
#define TIERD_IPC_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd::ipc {

inline constexpr size_t kFrameBytesMax = 64 * 1024;
// A hello's answer: the DRAM segment, the GPU pool and the session's rings
// (limits::kRingsPerSessionMax), with room to spare.
inline constexpr size_t kFrameFdsMax = 12;

// Listens at `path` with permissions `mode` (0600 by default). A leftover socket file
// nobody answers on is replaced; one a live process answers on is ALREADY_EXISTS.
absl::StatusOr<int> ListenUnix(const std::string& path, mode_t mode = 0600);
absl::StatusOr<int> ConnectUnix(const std::string& path);

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> GetPeerCredentials(int fd);

struct Frame {
  std::string payload;
  std::vector<int> fds;  // owned by the receiver
};

absl::Status SendFrame(int fd, absl::string_view payload, const std::vector<int>& fds = {});
// Waits at most `timeout_ms` (-1: forever) for the frame to arrive in full.
// UNAVAILABLE on a clean EOF before any byte (the peer went away).
absl::StatusOr<Frame> ReceiveFrame(int fd, int timeout_ms);

// A frame gathered without waiting, for a server that polls many peers: each call takes
// what has arrived (never blocks, never reads past the frame) and says whether the frame
// is whole. UNAVAILABLE when the peer closed first; INVALID_ARGUMENT for a frame over the
// limits. The descriptors received are the assembly's until taken (closed with it).
class FrameAssembly {
 public:
  FrameAssembly() = default;
  FrameAssembly(const FrameAssembly&) = delete;
  FrameAssembly& operator=(const FrameAssembly&) = delete;
  ~FrameAssembly();
  absl::StatusOr<bool> ReadAvailable(int fd);
  // The whole frame (after ReadAvailable said true); the assembly is empty after.
  Frame Take();
  size_t bytes() const { return bytes_.size(); }

 private:
  std::string bytes_;  // the header, then the payload as it comes
  std::vector<int> fds_;
};

}  // namespace tierd::ipc

#endif  // TIERD_IPC_UNIX_SOCKET_H_
