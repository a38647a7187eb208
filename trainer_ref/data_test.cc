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

// A directory of shards as tools/tokenize.py writes it: index.json naming shard-N.u32 files, a
// loss mask beside one of them. The shards concatenate in the index's order; the mask covers
// the tokens of every shard (all trained where a shard has none); the batches' targets are -1
// where the mask says not trained, and the same windows as without a mask otherwise.
TEST(DataTest, ShardDirectoriesWithLossMasks) {
  const std::string dir = Dir() + "/shards";
  mkdir(dir.c_str(), 0700);
  auto u32 = [](const std::vector<uint32_t>& ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
  };
  std::vector<uint32_t> a(100), b(60);
  for (uint32_t i = 0; i < a.size(); ++i) a[i] = i % 500;
  for (uint32_t i = 0; i < b.size(); ++i) b[i] = 1000 + i;
  Write(dir + "/shard-00001.u32", u32(b));  // named second by the index though first by name
  Write(dir + "/shard-00000.u32", u32(a));
  std::string mask(60, '\0');
  for (int i = 30; i < 60; ++i) mask[i] = 1;  // the second half of shard 1: a response
  Write(dir + "/shard-00001.mask", mask);
  Write(dir + "/index.json", R"({"vocab_size": 2000, "shards": [{"file": "shard-00000.u32", "tokens": 100},
                                  {"file": "shard-00001.u32", "tokens": 60}]})");
  auto d = LoadDataset(dir, 2000, 8, 0.25);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->train.size() + d->val.size(), 160u);
  EXPECT_EQ(d->train[0], 0);
  EXPECT_EQ(d->val.back(), 1059) << "the index's order: shard 0 then shard 1";
  ASSERT_EQ(d->train_mask.size(), d->train.size());
  ASSERT_EQ(d->val_mask.size(), d->val.size());
  EXPECT_EQ(d->train_mask[5], 1) << "a shard without a mask is all trained";
  EXPECT_EQ(d->train_mask[100], 0);
  EXPECT_EQ(d->val_mask.back(), 1);
  EXPECT_NE(d->source.find("% of them trained (a loss mask)"), std::string::npos) << d->source;
  // The batches: masked targets are -1, the rest the tokens; the windows those of no mask.
  Batcher masked(d->train, 4, 8, 3, &d->train_mask), plain(d->train, 4, 8, 3);
  std::vector<int32_t> in(32), tg(32), in2(32), tg2(32);
  int ignored = 0;
  for (int round = 0; round < 20; ++round) {
    masked.Next(in.data(), tg.data());
    plain.Next(in2.data(), tg2.data());
    EXPECT_EQ(in, in2);
    for (int j = 0; j < 32; ++j) {
      if (tg[j] < 0) {
        ++ignored;
        EXPECT_GE(tg2[j], 1000) << "only shard 1's prompt half is masked";
        EXPECT_LT(tg2[j], 1030);
      } else {
        EXPECT_EQ(tg[j], tg2[j]);
      }
    }
  }
  EXPECT_GT(ignored, 0);
  // A mask of the wrong length, or with a byte other than 0 and 1, is refused naming it.
  Write(dir + "/shard-00001.mask", std::string(59, '\1'));
  auto short_mask = LoadDataset(dir, 2000, 8, 0.25);
  EXPECT_EQ(short_mask.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_mask.status().message().find("has 59 bytes for the 60 tokens"), absl::string_view::npos)
      << short_mask.status();
  Write(dir + "/shard-00001.mask", std::string(60, '\2'));
  auto bad = LoadDataset(dir, 2000, 8, 0.25);
  EXPECT_NE(bad.status().message().find("byte 0 is 2; a loss mask holds 0"), absl::string_view::npos) << bad.status();
  // An index.json that is not a shard index is refused, not read as some other layout.
  const std::string other = Dir() + "/not-an-index";
  mkdir(other.c_str(), 0700);
  Write(other + "/index.json", R"({"files": ["a.u32"]})");
  auto not_index = LoadDataset(other, 2000, 8, 0.25);
  EXPECT_EQ(not_index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(not_index.status().message().find("is not a shard index"), absl::string_view::npos) << not_index.status();
  // A token outside the vocabulary, named with its shard and position.
  Write(dir + "/shard-00001.mask", mask);
  auto small = LoadDataset(dir, 1030, 8, 0.25);
  EXPECT_NE(small.status().message().find("shard-00001.u32': token 1030 at position 30 is outside"),
            absl::string_view::npos)
      << small.status();
}

}  // namespace
}  // namespace tierd::trainer
