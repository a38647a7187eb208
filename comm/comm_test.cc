#include <map>
#include <string>

#include "comm/communicator.h"
#include "comm/launch_env.h"
#include "gtest/gtest.h"

namespace tierd::comm {
namespace {

GetEnv From(const std::map<std::string, std::string>& env) {
  return [env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

TEST(SlicesTest, CoverTheTensorOnceInRankOrderWithAlignedBoundaries) {
  for (int64_t total : {0, 1, 63, 64, 1000, 10007}) {
    for (int ranks : {1, 2, 3, 4, 7}) {
      const Slices s = Slices::Even(total, ranks, 64);
      ASSERT_EQ(s.offset.size(), static_cast<size_t>(ranks));
      int64_t at = 0;
      for (int r = 0; r < ranks; ++r) {
        EXPECT_EQ(s.offset[r], at) << total << " " << ranks << " " << r;
        EXPECT_GE(s.count[r], 0);
        if (r + 1 < ranks && s.offset[r] + s.count[r] < total) {
          EXPECT_EQ((s.offset[r] + s.count[r]) % 64, 0);
        }
        at += s.count[r];
      }
      EXPECT_EQ(at, total) << total << " " << ranks;
    }
  }
  const Slices s = Slices::Even(1000, 4, 1);
  EXPECT_EQ(s.count, (std::vector<int64_t>{250, 250, 250, 250}));
}

TEST(LaunchEnvTest, ReadsEachLauncher) {
  auto mpi = LaunchFromEnv(From({{"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  ASSERT_TRUE(mpi.ok()) << mpi.status();
  EXPECT_EQ(mpi->launcher, "mpirun");
  EXPECT_EQ(mpi->rank, 1);
  EXPECT_EQ(mpi->size, 4);
  EXPECT_EQ(mpi->local_size, 2);
  EXPECT_EQ(mpi->Describe(), "rank 1 of 4 (local 1 of 2), launched by mpirun");
  auto torch = LaunchFromEnv(From({{"RANK", "3"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "3"},
                                   {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "29500"},
                                   {"SLURM_PROCID", "0"},
                                   {"SLURM_NTASKS", "1"}}));
  ASSERT_TRUE(torch.ok()) << torch.status();
  EXPECT_EQ(torch->launcher, "torchrun");  // torchrun's names win over the allocation's
  EXPECT_EQ(torch->rank, 3);
  EXPECT_EQ(torch->local_size, 8);  // no LOCAL_WORLD_SIZE: all of them
  EXPECT_EQ(torch->master_addr, "10.0.0.1");
  EXPECT_EQ(torch->master_port, 29500);
  EXPECT_EQ(torch->rendezvous_port, 29500) << "not under torchrun's agent: the port as given";
  // Under torchrun's agent (TORCHELASTIC_RUN_ID) its own store holds MASTER_PORT: the GPU
  // ranks meet on the next port, or on TIERD_RDZV_PORT.
  auto agent = LaunchFromEnv(From({{"RANK", "0"},
                                   {"WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "127.0.0.1"},
                                   {"MASTER_PORT", "29500"},
                                   {"TORCHELASTIC_RUN_ID", "none"}}));
  ASSERT_TRUE(agent.ok());
  EXPECT_EQ(agent->rendezvous_port, 29501);
  auto chosen = LaunchFromEnv(From({{"RANK", "0"},
                                    {"WORLD_SIZE", "2"},
                                    {"MASTER_PORT", "29500"},
                                    {"TORCHELASTIC_RUN_ID", "none"},
                                    {"TIERD_RDZV_PORT", "31000"}}));
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(chosen->rendezvous_port, 31000);
  auto slurm = LaunchFromEnv(From({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"}}));
  ASSERT_TRUE(slurm.ok());
  EXPECT_EQ(slurm->launcher, "srun");
  EXPECT_EQ(slurm->rank, 2);
  auto none = LaunchFromEnv(From({}));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->launcher, "none");
  EXPECT_EQ(none->size, 1);
}

TEST(LaunchEnvTest, BadValuesAreNamed) {
  auto outside = LaunchFromEnv(From({{"RANK", "4"}, {"WORLD_SIZE", "4"}}));
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().message(), "RANK=4 is outside [0, WORLD_SIZE=4)");
  auto word = LaunchFromEnv(From({{"RANK", "one"}, {"WORLD_SIZE", "4"}}));
  ASSERT_FALSE(word.ok());
  EXPECT_EQ(word.status().message(), "RANK=one is not a whole number");
  auto zero = LaunchFromEnv(From({{"RANK", "0"}, {"WORLD_SIZE", "0"}}));
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(), "WORLD_SIZE=0: need at least 1");
}

TEST(LocalCommunicatorTest, IsTheIdentityAndSendsNothing) {
  auto c = MakeLocalCommunicator();
  std::vector<float> x = {1, 2, 3};
  ASSERT_TRUE(c->AllReduce(x.data(), 3).ok());
  ASSERT_TRUE(c->ReduceScatterSum(x.data(), Slices::Even(3, 1)).ok());
  ASSERT_TRUE(c->AllGather(x.data(), Slices::Even(3, 1)).ok());
  EXPECT_EQ(x, (std::vector<float>{1, 2, 3}));
  int32_t in[2] = {5, 6}, out[2] = {};
  ASSERT_TRUE(c->AllGatherBytes(in, out, sizeof(in)).ok());
  EXPECT_EQ(out[1], 6);
  EXPECT_EQ(c->stats().bytes_sent, 0);
  EXPECT_EQ(c->size(), 1);
}

}  // namespace
}  // namespace tierd::comm
