// Hugging Face checkpoints made by transformers itself (tests/data/hf, made by
// tools/hf/make_fixtures.py): each loads into the CPU model, whose logits and loss on the
// fixture's tokens are transformers' own to fp32 rounding; exports read back bit for bit; and
// what is wrong with a checkpoint is refused naming it.
#include "trainer_ref/hf/hf_checkpoint.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "trainer_ref/hf/json.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/hf/safetensors.h"
#include "trainer_ref/model.h"
#include "trainer_ref/model_config_file.h"

namespace tierd::trainer::hf {
namespace {

std::string Fixture(const std::string& name) {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/tierd/tests/data/hf/" + name;
}

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

std::vector<std::string> Files(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  while (const dirent* e = d != nullptr ? readdir(d) : nullptr) {
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  }
  if (d != nullptr) closedir(d);
  return out;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Loaded {
  ModelConfig config;
  std::vector<float> params;  // ParamLayout order
};

absl::StatusOr<Loaded> Load(const std::string& dir) {
  auto config = ModelConfigFromFile(dir + "/config.json");
  if (!config.ok()) return config.status();
  auto reader = HfCheckpointReader::Open(dir, *config);
  if (!reader.ok()) return reader.status();
  Loaded out{*config, {}};
  const std::vector<TensorLayout> layout = ParamLayout(*config);
  out.params.resize(layout.back().offset + layout.back().count);
  for (size_t e = 0; e < layout.size(); ++e) {
    if (absl::Status s = (*reader)->Read(e, out.params.data() + layout[e].offset); !s.ok()) return s;
  }
  return out;
}

struct Expected {
  std::vector<int32_t> inputs, targets;
  double loss = 0;
  std::vector<float> logits;
  int batch = 0, seq = 0;
};

Expected ReadExpected(const std::string& dir) {
  Expected e;
  auto json = ParseJson(Slurp(dir + "/fixture.json"));
  EXPECT_TRUE(json.ok()) << json.status();
  for (const char* key : {"inputs", "targets"}) {
    std::vector<int32_t>& out = std::string(key) == "inputs" ? e.inputs : e.targets;
    const JsonValue* rows = json->Find(key);
    e.batch = static_cast<int>(rows->items.size());
    e.seq = static_cast<int>(rows->items[0].items.size());
    for (const JsonValue& row : rows->items) {
      for (const JsonValue& v : row.items) out.push_back(static_cast<int32_t>(v.number));
    }
  }
  e.loss = json->Find("loss")->number;
  auto logits = SafetensorsFile::Open(dir + "/expected.safetensors");
  EXPECT_TRUE(logits.ok()) << logits.status();
  const TensorInfo* t = (*logits)->Find("logits");
  e.logits.resize(t->Count());
  (*logits)->ReadFloats(*t, 0, t->Count(), e.logits.data());
  return e;
}

// transformers' logits and loss from the CPU model (fp32) with the checkpoint's weights:
// within 1e-4 of each logit's size (at least of the logits' rms) and 1e-5 of the loss.
class HfFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixtureTest, LogitsAndLossAreTransformers) {
  const std::string dir = Fixture(GetParam());
  auto loaded = Load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const Expected want = ReadExpected(dir);
  Model<float> model(loaded->config, want.batch, want.seq);
  model.params() = loaded->params;
  const float loss = model.Forward(want.inputs.data(), want.targets.data());
  std::vector<float> logits;
  model.LastLogits(&logits);
  ASSERT_EQ(logits.size(), want.logits.size());
  double square = 0, worst = 0;
  for (float x : want.logits) square += double(x) * x;
  const double rms = std::sqrt(square / want.logits.size());
  int off = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double error = std::abs(double(logits[i]) - want.logits[i]) / std::max<double>(std::abs(want.logits[i]), rms);
    worst = std::max(worst, error);
    if (error > 1e-4 && off++ < 5) ADD_FAILURE() << "logit " << i << ": ours " << logits[i] << ", transformers' " << want.logits[i];
  }
  EXPECT_NEAR(loss, want.loss, 1e-5 * want.loss);
  std::printf("%s (%s): loss %.7f vs transformers' %.7f; logits' worst relative error %.3g (rms %.3g)\n",
              GetParam().c_str(), DescribeConfig(loaded->config).c_str(), loss, want.loss, worst, rms);
}

// Export (bf16 or fp32), load the export: the same values, bit for bit (bf16: as rounded);
// a checkpoint stored in bf16 exports to the same tensor bytes; config.json is the source's.
TEST_P(HfFixtureTest, ExportReadsBackBitForBit) {
  const std::string dir = Fixture(GetParam());
  auto loaded = Load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<TensorLayout> layout = ParamLayout(loaded->config);
  auto read = [&](size_t e, float* out) {
    std::copy_n(loaded->params.data() + layout[e].offset, layout[e].count, out);
    return absl::OkStatus();
  };
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16}) {
    const std::string out = TempDir(GetParam() + DtypeName(dtype));
    ExportOptions options;
    options.dtype = dtype;
    options.source_dir = dir;
    options.max_shard_bytes = 40000;  // several shards and an index
    ASSERT_TRUE(ExportHfCheckpoint(loaded->config, out, read, options).ok());
    EXPECT_EQ(Slurp(out + "/config.json"), Slurp(dir + "/config.json"));
    EXPECT_EQ(Slurp(out + "/generation_config.json"), Slurp(dir + "/generation_config.json"));
    auto again = Load(out);
    ASSERT_TRUE(again.ok()) << again.status();
    for (size_t i = 0; i < again->params.size(); ++i) {
      const float want = dtype == Dtype::kF32 ? loaded->params[i] : [&] {
        const uint32_t bits = static_cast<uint32_t>(Bf16Bits(loaded->params[i])) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
      }();
      ASSERT_EQ(again->params[i], want) << i << " " << DtypeName(dtype);
    }
    // And again from the export: the same files, byte for byte.
    const std::string out2 = TempDir(GetParam() + DtypeName(dtype) + "-2");
    ExportOptions options2 = options;
    options2.source_dir = out;
    auto read2 = [&](size_t e, float* o) {
      std::copy_n(again->params.data() + layout[e].offset, layout[e].count, o);
      return absl::OkStatus();
    };
    ASSERT_TRUE(ExportHfCheckpoint(again->config, out2, read2, options2).ok());
    int files = 0;
    for (const std::string& f : Files(out)) {
      EXPECT_EQ(Slurp(out2 + "/" + f), Slurp(out + "/" + f)) << f;
      files += f.find(".safetensors") != std::string::npos;
    }
    EXPECT_GT(files, 2) << "shards and their index";
  }
  if (GetParam() == "llama3") {  // stored in bf16: one shard exported in bf16 is the source's tensors' bytes
    const std::string out = TempDir("llama3-bytes");
    ExportOptions options;
    options.max_shard_bytes = uint64_t{1} << 30;
    ASSERT_TRUE(ExportHfCheckpoint(loaded->config, out, read, options).ok());
    auto exported = SafetensorsFile::Open(out + "/model.safetensors");
    ASSERT_TRUE(exported.ok());
    int compared = 0;
    for (const char* shard : {"model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                              "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}) {
      auto source = SafetensorsFile::Open(dir + "/" + shard);
      ASSERT_TRUE(source.ok());
      for (const TensorInfo& t : (*source)->tensors()) {
        const TensorInfo* e = (*exported)->Find(t.name);
        ASSERT_NE(e, nullptr) << t.name;
        ASSERT_EQ(t.end - t.begin, e->end - e->begin);
        EXPECT_EQ(std::memcmp((*source)->Bytes(t), (*exported)->Bytes(*e), t.end - t.begin), 0) << t.name;
        ++compared;
      }
    }
    EXPECT_EQ(compared, static_cast<int>(layout.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfFixtureTest, ::testing::Values("llama2", "llama3", "mistral", "qwen2"));

// Copies a fixture's files to a new directory, where a test can break them.
std::string CopyFixture(const std::string& name, const std::string& to) {
  const std::string from = Fixture(name), dir = TempDir(to);
  mkdir(dir.c_str(), 0755);
  for (const char* f : {"config.json", "model.safetensors"}) std::ofstream(dir + "/" + f, std::ios::binary) << Slurp(from + "/" + f);
  return dir;
}

TEST(HfCheckpointTest, WhatIsWrongWithACheckpointIsRefusedByName) {
  // A config that does not match the weights: each tensor of another shape is named with both shapes.
  const std::string dir = CopyFixture("llama2", "wrong-shape");
  auto config = ModelConfigFromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  ModelConfig wider = *config;
  wider.d_ff = 192;
  auto shape = HfCheckpointReader::Open(dir, wider);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("'model.layers.0.mlp.gate_proj.weight' is [128, 64] there; this config needs [192, 64]"),
            absl::string_view::npos)
      << shape.status();
  // Tied: the checkpoint's lm_head has no place (and a tied one lacks it: missing).
  ModelConfig tied = *config;
  tied.tied_embeddings = true;
  EXPECT_TRUE(HfCheckpointReader::Open(dir, tied).ok()) << "a tied model ignores an lm_head it would tie anyway";
  auto qwen = ModelConfigFromFile(Fixture("qwen2") + "/config.json");
  ModelConfig untied = *qwen;
  untied.tied_embeddings = false;
  auto missing = HfCheckpointReader::Open(Fixture("qwen2"), untied);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("has no tensor 'lm_head.weight' (head.w, shape [320, 64])"),
            absl::string_view::npos)
      << missing.status();
  // The biases of a Qwen2 checkpoint read as a Llama: no place for them.
  ModelConfig no_bias = *qwen;
  no_bias.qkv_bias = false;
  auto extra = HfCheckpointReader::Open(Fixture("qwen2"), no_bias);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(extra.status().message().find("has tensors this model has no place for: 'model.layers.0.self_attn.k_proj.bias' [32]"),
            absl::string_view::npos)
      << extra.status();
  // A cut shard: refused with the file and the byte offset.
  const std::string cut = CopyFixture("llama2", "cut");
  const std::string bytes = Slurp(cut + "/model.safetensors");
  std::ofstream(cut + "/model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  auto damaged = HfCheckpointReader::Open(cut, *config);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(damaged.status().message().find(cut + "/model.safetensors', byte "), absl::string_view::npos)
      << damaged.status();
  EXPECT_NE(damaged.status().message().find("(the file is cut)"), absl::string_view::npos) << damaged.status();
  // No weights at all.
  const std::string empty = TempDir("empty");
  mkdir(empty.c_str(), 0755);
  auto none = HfCheckpointReader::Open(empty, *config);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("neither model.safetensors nor model.safetensors.index.json"),
            absl::string_view::npos);
  // An index that names a shard without the tensor.
  const std::string lying = TempDir("lying-index");
  mkdir(lying.c_str(), 0755);
  for (const std::string f : {"config.json", "model-00001-of-00004.safetensors", "model-00002-of-00004.safetensors",
                              "model-00003-of-00004.safetensors", "model-00004-of-00004.safetensors"}) {
    std::ofstream(lying + "/" + f, std::ios::binary) << Slurp(Fixture("llama3") + "/" + f);
  }
  std::string index = Slurp(Fixture("llama3") + "/model.safetensors.index.json");
  const size_t at = index.find("\"model.norm.weight\": \"model-0000");
  ASSERT_NE(at, std::string::npos);
  index[at + std::string("\"model.norm.weight\": \"model-0000").size()] = '1';
  std::ofstream(lying + "/model.safetensors.index.json") << index;
  auto llama3 = ModelConfigFromFile(lying + "/config.json");
  auto lied = HfCheckpointReader::Open(lying, *llama3);
  EXPECT_EQ(lied.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(lied.status().message().find("puts 'model.norm.weight' in 'model-00001-of-00004.safetensors'"),
            absl::string_view::npos)
      << lied.status();
}

// A disk that fills up under an export (a file size limit stands in for it): RESOURCE_EXHAUSTED
// naming the shard, and no shard, partial file or index left behind.
TEST(HfCheckpointTest, AnExportOntoAFullDiskSaysSoAndLeavesNoShard) {
  auto loaded = Load(Fixture("llama2"));  // 0.5 MB of fp32
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<TensorLayout> layout = ParamLayout(loaded->config);
  const std::string dir = TempDir("full");
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing the test
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  ExportOptions options;
  options.dtype = Dtype::kF32;
  const absl::Status full = ExportHfCheckpoint(
      loaded->config, dir,
      [&](size_t e, float* out) {
        std::copy_n(loaded->params.data() + layout[e].offset, layout[e].count, out);
        return absl::OkStatus();
      },
      options);
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_NE(full.message().find(dir + "/model.safetensors"), absl::string_view::npos) << full;
  EXPECT_TRUE(Files(dir).empty()) << "left behind: " << Files(dir).size() << " files";
}

TEST(HfCheckpointTest, AnExportNeverOverwrites) {
  const std::string dir = TempDir("occupied");
  mkdir(dir.c_str(), 0755);
  EXPECT_TRUE(CheckExportDir(dir).ok()) << "an empty directory takes an export";
  EXPECT_TRUE(CheckExportDir(dir + "/new").ok()) << "so does one to be made";
  std::ofstream(dir + "/notes.txt") << "mine";
  EXPECT_EQ(CheckExportDir(dir).code(), absl::StatusCode::kFailedPrecondition);
  auto config = ModelConfigFromFile(Fixture("llama2") + "/config.json");
  auto refused = ExportHfCheckpoint(*config, dir, [](size_t, float*) { return absl::OkStatus(); }, {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Slurp(dir + "/notes.txt"), "mine");
}

// A config.json made for a model with no source (trained from scratch) reads back as the same
// model, and names the architecture transformers loads.
TEST(HfCheckpointTest, AMadeConfigReadsBackAsTheSameModel) {
  for (const char* name : {"llama2", "llama3", "mistral", "qwen2"}) {
    auto config = ModelConfigFromFile(Fixture(name) + "/config.json");
    ASSERT_TRUE(config.ok());
    const std::string json = HfConfigJson(*config);
    auto again = ModelConfigFromJson(json, "made");
    ASSERT_TRUE(again.ok()) << again.status() << "\n" << json;
    EXPECT_EQ(FamilyRecord(*again), FamilyRecord(*config)) << name;
    EXPECT_EQ(again->Params(), config->Params()) << name;
    EXPECT_EQ(again->sliding_window, config->sliding_window) << name;
    EXPECT_EQ(again->rope_theta, config->rope_theta) << name;
  }
  EXPECT_EQ(HfName("layers.12.attn.bq"), "model.layers.12.self_attn.q_proj.bias");
  EXPECT_EQ(HfName("layers.0.mlp.w3"), "model.layers.0.mlp.up_proj.weight");
}

}  // namespace
}  // namespace tierd::trainer::hf
