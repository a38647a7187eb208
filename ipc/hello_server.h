// HelloServer: the daemon's Unix socket. A client connects, sends one HelloRequest frame;
// the server checks the peer's uid against the allowed set (SO_PEERCRED), asks the
// handler for a session, and replies with a HelloReply frame carrying the session's
// descriptors. The connection then stays open, silent, for the session's life: when it
// closes (the client exited or was killed), or the client sends anything more, the
// handler is told to end the session.
//
// One thread polls the listening socket, the connections whose hello has not arrived yet
// and every session connection; nothing blocks on one peer. A client that connects and
// says nothing is dropped after kHelloTimeoutMs; garbage is answered with an error reply
// where possible, and never touches another session.
//
// Thread-safety: Start and the destructor from one thread; the handler is called on the
// server's thread.
#ifndef TIERD_IPC_HELLO_SERVER_H_
#define TIERD_IPC_HELLO_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "ipc/unix_socket.h"
#include "proto/tierd.pb.h"

namespace tierd::ipc {

inline constexpr int kHelloTimeoutMs = 2000;
inline constexpr uint32_t kProtocolVersion = 1;
// The gRPC metadata of administration and listing calls: the caller's session (decimal) and
// its token (binary), from a hello (HelloRequest.observer for one that leases nothing).
inline constexpr char kSessionMetadata[] = "tierd-session";
inline constexpr char kTokenMetadata[] = "tierd-token-bin";

struct HelloGrant {
  uint64_t session_id = 0;
  tierd::v1::HelloReply reply;
  std::vector<int> fds;           // sent with the reply
  std::vector<int> fds_to_close;  // closed after sending (e.g. a fresh export)
};

class HelloHandler {
 public:
  virtual ~HelloHandler() = default;
  virtual absl::StatusOr<HelloGrant> OnHello(const PeerCredentials& peer,
                                             const tierd::v1::HelloRequest& request) = 0;
  virtual void OnGoodbye(uint64_t session_id) = 0;
};

class HelloServer {
 public:
  // `allowed_uids` empty: only the daemon's own uid.
  static absl::StatusOr<std::unique_ptr<HelloServer>> Start(const std::string& path,
                                                            std::set<uid_t> allowed_uids,
                                                            HelloHandler& handler);
  // Stops the thread, ends every session (OnGoodbye), closes and unlinks the socket.
  ~HelloServer();
  const std::string& path() const { return path_; }
  size_t connected_sessions() const { return connected_.load(); }

 private:
  HelloServer(std::string path, int listen_fd, int wake_read, int wake_write, std::set<uid_t> uids,
              HelloHandler& handler)
      : path_(std::move(path)), listen_fd_(listen_fd), wake_read_(wake_read),
        wake_write_(wake_write), allowed_uids_(std::move(uids)), handler_(handler) {}
  void Run();
  void Accept();
  // Takes what the connection sent so far; greets it once its hello is whole. Never waits
  // on one peer: a client that sends part of a frame and stops only holds its own slot.
  void Read(int fd);
  void Greet(int fd, Frame frame);

  const std::string path_;
  const int listen_fd_;
  const int wake_read_, wake_write_;
  const std::set<uid_t> allowed_uids_;
  HelloHandler& handler_;
  std::map<int, uint64_t> sessions_;  // connection fd -> session id (server thread only)
  struct Pending {
    int64_t deadline_ms;  // steady clock
    std::unique_ptr<FrameAssembly> hello;
  };
  std::map<int, Pending> pending_;  // connections whose hello is not whole yet
  std::atomic<size_t> connected_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tierd::ipc

#endif  // TIERD_IPC_HELLO_SERVER_H_
