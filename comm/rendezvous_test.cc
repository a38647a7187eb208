#include "comm/rendezvous.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tierd::comm {
namespace {

// A port nothing listens on now (the kernel's pick, released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

LaunchInfo Rank(int rank, int size, int port) {
  LaunchInfo l;
  l.launcher = "torchrun";
  l.rank = rank;
  l.size = size;
  l.master_addr = "127.0.0.1";
  l.master_port = port;
  l.rendezvous_port = port;
  return l;
}

TEST(RendezvousTest, EveryRankGetsRankZerosBytes) {
  for (int size : {2, 4}) {
    const int port = FreePort();
    const std::string id(128, '\x5a');
    std::vector<absl::StatusOr<std::string>> got(size, absl::UnknownError("not run"));
    std::vector<std::thread> ranks;
    // The others first: they retry until rank 0 listens.
    for (int r = size - 1; r >= 0; --r) {
      ranks.emplace_back([&, r] { got[r] = ShareFromRankZero(Rank(r, size, port), r == 0 ? id : "ignored", {10}); });
    }
    for (auto& t : ranks) t.join();
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(got[r].ok()) << r << ": " << got[r].status();
      EXPECT_EQ(*got[r], id) << r;
    }
  }
  EXPECT_EQ(*ShareFromRankZero(LaunchInfo{}, "alone"), "alone") << "one process: no network";
}

TEST(RendezvousTest, AMissingRankZeroOrPeerOrAddressIsAClearError) {
  const int port = FreePort();
  auto lonely = ShareFromRankZero(Rank(1, 2, port), "", {0.5});
  EXPECT_EQ(lonely.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(lonely.status().message().find("rank 1: no rank 0 at MASTER_ADDR:MASTER_PORT = 127.0.0.1:"),
            std::string::npos)
      << lonely.status();

  auto waiting = ShareFromRankZero(Rank(0, 3, port), "id", {0.5});
  EXPECT_EQ(waiting.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(waiting.status().message().find("0 of the other 2 ranks came"), std::string::npos) << waiting.status();

  LaunchInfo unset = Rank(1, 2, 0);
  unset.master_addr.clear();
  auto no_address = ShareFromRankZero(unset, "");
  EXPECT_EQ(no_address.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(no_address.status().message().find("export MASTER_ADDR="), std::string::npos) << no_address.status();
}

TEST(RendezvousTest, ATakenPortAndAForeignServiceAreNamed) {
  // Something else listens on the port: rank 0 cannot, and a rank that reaches it says it is not ours.
  const int port = FreePort();
  const int other = socket(AF_INET6, SOCK_STREAM, 0);
  const int zero = 0;
  setsockopt(other, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_any;
  addr.sin6_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(other, 4), 0);
  auto taken = ShareFromRankZero(Rank(0, 2, port), "id", {0.5});
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(taken.status().message().find("give a free MASTER_PORT"), std::string::npos) << taken.status();
  std::thread service([other] {
    const int peer = accept(other, nullptr, nullptr);
    const char junk[8] = {'H', 'T', 'T', 'P', '/', '1', '.', '1'};
    (void)!write(peer, junk, sizeof(junk));
    close(peer);
  });
  auto foreign = ShareFromRankZero(Rank(1, 2, port), "", {2});
  service.join();
  close(other);
  EXPECT_EQ(foreign.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(foreign.status().message().find("not a tierd rank 0"), std::string::npos) << foreign.status();
}

}  // namespace
}  // namespace tierd::comm
