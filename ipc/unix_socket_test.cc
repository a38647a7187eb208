#include "ipc/unix_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "ipc/hello_server.h"

namespace tierd::ipc {
namespace {

std::string SocketPath(const char* name) {
  // sun_path is short: use /tmp rather than the (long) TEST_TMPDIR.
  return std::string("/tmp/tierd-test-") + name + "-" + std::to_string(getpid()) + ".sock";
}

TEST(UnixSocketTest, FramesCarryPayloadAndDescriptors) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  int data[2];
  ASSERT_EQ(pipe(data), 0);
  ASSERT_TRUE(SendFrame(pair[0], "hello", {data[1]}).ok());
  auto frame = ReceiveFrame(pair[1], 1000);
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_EQ(frame->payload, "hello");
  ASSERT_EQ(frame->fds.size(), 1u);
  ASSERT_EQ(write(frame->fds[0], "x", 1), 1);  // the received fd is the pipe's write end
  char c = 0;
  ASSERT_EQ(read(data[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  for (int fd : {pair[0], pair[1], data[0], data[1], frame->fds[0]}) close(fd);
}

TEST(UnixSocketTest, MalformedFramesAreErrorsNotCrashes) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  const unsigned char huge[4] = {0xFF, 0xFF, 0xFF, 0x7F};
  ASSERT_EQ(write(pair[0], huge, 4), 4);
  EXPECT_EQ(ReceiveFrame(pair[1], 1000).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReceiveFrame(pair[1], 50).status().code(), absl::StatusCode::kDeadlineExceeded);
  const unsigned char truncated[6] = {100, 0, 0, 0, 'a', 'b'};
  ASSERT_EQ(write(pair[0], truncated, 6), 6);
  close(pair[0]);
  auto status = ReceiveFrame(pair[1], 1000).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("mid-frame"), absl::string_view::npos);
  EXPECT_EQ(ReceiveFrame(pair[1], 1000).status().code(), absl::StatusCode::kUnavailable);
  close(pair[1]);
}

TEST(UnixSocketTest, ListeningIsPrivateAndRefusesALiveOwner) {
  const std::string path = SocketPath("listen");
  auto first = ListenUnix(path);
  ASSERT_TRUE(first.ok()) << first.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ListenUnix(path).status().code(), absl::StatusCode::kAlreadyExists);
  close(*first);  // the file stays, nobody answers: a stale socket is replaced
  auto second = ListenUnix(path);
  EXPECT_TRUE(second.ok()) << second.status();
  close(*second);
  unlink(path.c_str());
}

class RecordingHandler : public HelloHandler {
 public:
  absl::StatusOr<HelloGrant> OnHello(const PeerCredentials& peer,
                                     const tierd::v1::HelloRequest& request) override {
    if (request.label() == "refuse-me") return absl::ResourceExhaustedError("no room");
    HelloGrant grant;
    grant.session_id = ++sessions;
    grant.reply.set_session_id(grant.session_id);
    grant.reply.set_message("pid " + std::to_string(peer.pid));
    int data[2];
    EXPECT_EQ(pipe(data), 0);
    grant.fds = {data[0]};
    grant.fds_to_close = {data[0], data[1]};
    return grant;
  }
  void OnGoodbye(uint64_t session) override {
    goodbyes += session;
    if (goodbyes > 0) gone.Notify();
  }
  std::atomic<uint64_t> sessions{0};
  std::atomic<uint64_t> goodbyes{0};
  absl::Notification gone;
};

tierd::v1::HelloReply Hello(const std::string& path, const std::string& payload, uint32_t* fds,
                            int* connection) {
  auto fd = ConnectUnix(path);
  EXPECT_TRUE(fd.ok()) << fd.status();
  EXPECT_TRUE(SendFrame(*fd, payload).ok());
  auto frame = ReceiveFrame(*fd, 5000);
  EXPECT_TRUE(frame.ok()) << frame.status();
  tierd::v1::HelloReply reply;
  reply.ParseFromString(frame->payload);
  *fds = frame->fds.size();
  for (int f : frame->fds) close(f);
  *connection = *fd;
  return reply;
}

TEST(HelloServerTest, GrantsChecksAndNoticesDeparture) {
  const std::string path = SocketPath("hello");
  RecordingHandler handler;
  auto server = HelloServer::Start(path, {}, handler);
  ASSERT_TRUE(server.ok()) << server.status();
  tierd::v1::HelloRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_label("trainer");
  uint32_t fds = 0;
  int connection = -1;
  auto reply = Hello(path, request.SerializeAsString(), &fds, &connection);
  EXPECT_EQ(reply.code(), 0);
  EXPECT_EQ(reply.session_id(), 1u);
  EXPECT_EQ(fds, 1u);
  EXPECT_EQ(reply.message(), "pid " + std::to_string(getpid()));
  close(connection);  // the client goes away: the session ends
  EXPECT_TRUE(handler.gone.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(handler.goodbyes.load(), 1u);

  int other = -1;
  reply = Hello(path, "\x01\x02garbage", &fds, &other);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  close(other);
  request.set_protocol_version(99);
  reply = Hello(path, request.SerializeAsString(), &fds, &other);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  close(other);
  request.set_protocol_version(kProtocolVersion);
  request.set_label("refuse-me");
  reply = Hello(path, request.SerializeAsString(), &fds, &other);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(reply.message(), "no room");
  close(other);
  EXPECT_EQ(handler.sessions.load(), 1u);  // none of those made a session
}

// A frame that arrives a byte at a time is gathered without waiting: not whole until its
// last byte, then its payload; descriptors come with it; a peer that closes mid-frame is
// UNAVAILABLE.
TEST(UnixSocketTest, AFrameIsAssembledFromWhatHasArrived) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  FrameAssembly assembly;
  auto none = assembly.ReadAvailable(pair[1]);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(*none) << "nothing has arrived";
  const char bytes[] = {5, 0, 0, 0, 'h', 'e', 'l', 'l', 'o'};
  for (int i = 0; i < 9; ++i) {
    ASSERT_EQ(send(pair[0], bytes + i, 1, 0), 1);
    auto done = assembly.ReadAvailable(pair[1]);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(*done, i == 8) << "after byte " << i;
  }
  EXPECT_EQ(assembly.Take().payload, "hello");
  int shared[2];
  ASSERT_EQ(pipe(shared), 0);
  ASSERT_TRUE(SendFrame(pair[0], "fd", {shared[0]}).ok());
  FrameAssembly with_fd;
  auto whole = with_fd.ReadAvailable(pair[1]);
  ASSERT_TRUE(whole.ok() && *whole) << whole.status();
  Frame frame = with_fd.Take();
  EXPECT_EQ(frame.payload, "fd");
  ASSERT_EQ(frame.fds.size(), 1u);
  close(frame.fds[0]);
  FrameAssembly cut;
  ASSERT_EQ(send(pair[0], bytes, 3, 0), 3);
  close(pair[0]);
  EXPECT_EQ(cut.ReadAvailable(pair[1]).status().code(), absl::StatusCode::kUnavailable);
  for (int fd : {pair[1], shared[0], shared[1]}) close(fd);
}

// Connections that send part of a hello and stop do not delay anyone else's hello: the
// server reads what each sent without waiting on any (200 of them once cost 200 ms each).
TEST(HelloServerTest, HalfSentHellosDoNotStallOthers) {
  const std::string path = SocketPath("slow");
  RecordingHandler handler;
  auto server = HelloServer::Start(path, {}, handler);
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> stalled;
  for (int i = 0; i < 50; ++i) {
    auto fd = ConnectUnix(path);
    ASSERT_TRUE(fd.ok()) << fd.status();
    ASSERT_EQ(send(*fd, "\x10", 1, 0), 1);  // one byte of a header
    stalled.push_back(*fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the server has seen them all
  tierd::v1::HelloRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_label("trainer");
  uint32_t fds = 0;
  int connection = -1;
  const auto start = std::chrono::steady_clock::now();
  auto reply = Hello(path, request.SerializeAsString(), &fds, &connection);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(reply.code(), 0) << reply.message();
  EXPECT_LT(seconds, 1.0) << "the hello waited behind the stalled connections (50 x 200 ms = 10 s before)";
  close(connection);
  for (int fd : stalled) close(fd);
}

TEST(HelloServerTest, RefusesUidsNotAllowed) {
  const std::string path = SocketPath("uid");
  RecordingHandler handler;
  auto server = HelloServer::Start(path, {getuid() + 1}, handler);
  ASSERT_TRUE(server.ok());
  tierd::v1::HelloRequest request;
  request.set_protocol_version(kProtocolVersion);
  uint32_t fds = 0;
  int connection = -1;
  auto reply = Hello(path, request.SerializeAsString(), &fds, &connection);
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_NE(reply.message().find("may not use this tierd"), std::string::npos);
  close(connection);
  EXPECT_EQ(handler.sessions.load(), 0u);
}

TEST(HelloServerTest, ShutdownEndsSessionsAndRemovesTheSocket) {
  const std::string path = SocketPath("stop");
  RecordingHandler handler;
  int connection = -1;
  {
    auto server = HelloServer::Start(path, {}, handler);
    ASSERT_TRUE(server.ok());
    tierd::v1::HelloRequest request;
    request.set_protocol_version(kProtocolVersion);
    uint32_t fds = 0;
    Hello(path, request.SerializeAsString(), &fds, &connection);
    // Wait until the server has registered the session.
    for (int i = 0; i < 200 && (*server)->connected_sessions() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ((*server)->connected_sessions(), 1u);
  }
  EXPECT_EQ(handler.goodbyes.load(), 1u);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  close(connection);
}

}  // namespace
}  // namespace tierd::ipc
