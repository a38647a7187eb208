#include "trainer_ref/data.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace tierd::trainer {
namespace {

std::string Dir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(DataTest, TheEmbeddedCorpusIsDeterministicAndSplit) {
  EXPECT_EQ(EmbeddedCorpus(), EmbeddedCorpus());
  EXPECT_GE(EmbeddedCorpus().size(), 200000u);
  auto d = LoadDataset("embedded", 256, 64, 0.1);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_NEAR(static_cast<double>(d->val.size()) / (d->train.size() + d->val.size()), 0.1, 1e-3);
  const std::string corpus = EmbeddedCorpus();
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(d->train[i], static_cast<unsigned char>(corpus[i])) << i;  // bytes
  EXPECT_NE(d->source.find("embedded corpus"), std::string::npos);
}

TEST(DataTest, TextDirectoriesAndShardsLoad) {
  const std::string dir = Dir() + "/texts";
  mkdir(dir.c_str(), 0700);
  Write(dir + "/b.txt", std::string(300, 'b'));
  Write(dir + "/a.txt", std::string(300, 'a'));
  Write(dir + "/skip.md", "not text");
  auto d = LoadDataset(dir, 256, 16, 0.5);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->train.front(), 'a');  // sorted by name
  EXPECT_EQ(d->val.back(), 'b');
  EXPECT_EQ(d->train.size() + d->val.size(), 600u);
  std::string u16;
  for (uint16_t id = 0; id < 100; ++id) u16.append(reinterpret_cast<const char*>(&id), 2);
  Write(Dir() + "/tokens.u16", u16);
  auto s = LoadDataset(Dir() + "/tokens.u16", 1000, 8, 0.2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train[42], 42);
  std::string u32;
  for (uint32_t id = 0; id < 50; ++id) u32.append(reinterpret_cast<const char*>(&id), 4);
  Write(Dir() + "/tokens.u32", u32);
  auto w = LoadDataset(Dir() + "/tokens.u32", 70000, 8, 0.2);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->train[7], 7);
}

TEST(DataTest, BadInputIsExplained) {
  EXPECT_EQ(LoadDataset("/nonexistent/corpus", 256, 8, 0.1).status().code(), absl::StatusCode::kNotFound);
  Write(Dir() + "/odd.u16", "abc");
  auto odd = LoadDataset(Dir() + "/odd.u16", 1000, 1, 0);
  ASSERT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(odd.status().message().find("3 bytes, not a whole number of 2-byte tokens"), absl::string_view::npos)
      << odd.status();
  std::string big;
  for (uint16_t id : {1, 2, 60000}) big.append(reinterpret_cast<const char*>(&id), 2);
  Write(Dir() + "/big.u16", big);
  auto vocab = LoadDataset(Dir() + "/big.u16", 1000, 1, 0);
  EXPECT_NE(vocab.status().message().find("token 60000 at position 2 is outside the model's vocabulary of 1000"),
            absl::string_view::npos)
      << vocab.status();
  Write(Dir() + "/short.txt", "too short");
  auto too_short = LoadDataset(Dir() + "/short.txt", 256, 64, 0.1);
  ASSERT_EQ(too_short.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_short.status().message().find("9 tokens: too few for windows of 65"), absl::string_view::npos)
      << too_short.status();
  const std::string empty_dir = Dir() + "/empty";
  mkdir(empty_dir.c_str(), 0700);
  EXPECT_NE(LoadDataset(empty_dir, 256, 8, 0.1).status().message().find("no .txt files"), absl::string_view::npos);
  EXPECT_EQ(LoadDataset("embedded", 100, 8, 0.1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataTest, BatchesAreShiftedWindowsAndRepeatForASeed) {
  std::vector<int32_t> tokens(1000);
  for (int i = 0; i < 1000; ++i) tokens[i] = i;
  Batcher a(tokens, 4, 16, 7), b(tokens, 4, 16, 7);
  std::vector<int32_t> in(64), out(64), in2(64), out2(64);
  a.Next(in.data(), out.data());
  b.Next(in2.data(), out2.data());
  EXPECT_EQ(in, in2);
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(out[r * 16 + i], in[r * 16 + i] + 1);
      if (i > 0) {
        EXPECT_EQ(in[r * 16 + i], in[r * 16 + i - 1] + 1);
      }
    }
  }
}

// A resumed run skips the batches the first run drew and continues with the same ones.
TEST(DataTest, SkippingBatchesContinuesTheSameOrder) {
  auto data = LoadDataset("embedded", kByteVocab, 16, 0.1);
  ASSERT_TRUE(data.ok());
  Batcher straight(data->train, 3, 16, 42), resumed(data->train, 3, 16, 42);
  std::vector<int32_t> in(48), tg(48), in2(48), tg2(48);
  for (int i = 0; i < 7; ++i) straight.Next(in.data(), tg.data());
  resumed.Skip(7);
  for (int i = 0; i < 3; ++i) {
    straight.Next(in.data(), tg.data());
    resumed.Next(in2.data(), tg2.data());
    EXPECT_EQ(in, in2) << "batch " << 8 + i;
    EXPECT_EQ(tg, tg2);
  }
}

}  // namespace
}  // namespace tierd::trainer
