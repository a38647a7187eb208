// tierd-train export from a GPU trainer's checkpoint, without a GPU: a checkpoint laid out as
// GpuModel::SaveState writes it (a "run" record, the "model" shape, then per group its bf16
// weights, master weights and moments) exports its master weights, group by group; another
// model's checkpoint is refused saying both.
#include "trainer_ref/export_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/model.h"

namespace tierd::trainer {
namespace {

std::string TempDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

ModelConfig Gqa() {
  ModelConfig c{"gqa", 2, 32, 4, 48, 40, 16};
  c.kv_heads = 2;
  c.qkv_bias = true;
  return c;
}

TEST(ExportCheckpointTest, AGpuCheckpointsMasterWeightsGroupByGroup) {
  const ModelConfig config = Gqa();
  const std::vector<TensorLayout> layout = ParamLayout(config);
  const size_t count = layout.back().offset + layout.back().count;
  std::vector<float> master(count);
  for (size_t i = 0; i < count; ++i) master[i] = 0.001f * static_cast<float>(i) - 1.f;
  const std::string dir = TempDir("gpu-ckpt");
  mkdir(dir.c_str(), 0755);
  auto writer = CheckpointWriter::Create(dir, 7);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::string run = "run state";
  ASSERT_TRUE((*writer)->Append("run", run.data(), run.size()).ok());
  const std::string shape =
      absl::StrFormat("layers=2 d_model=32 heads=4 d_ff=48 vocab=40 norm_eps=1e-05 rope_theta=10000 params=%d%s", count,
                      FamilyRecord(config));
  ASSERT_TRUE((*writer)->Append("model", shape.data(), shape.size()).ok());
  // The groups: the embedding, each layer (its entries back to back), the final norm and head.
  const ParamEntries e = ParamEntriesOf(config);
  const std::vector<std::pair<std::string, std::pair<size_t, size_t>>> groups = {
      {"embed", {layout[e.embed].offset, layout[e.layers[0].attn_norm].offset}},
      {"layers.0", {layout[e.layers[0].attn_norm].offset, layout[e.layers[1].attn_norm].offset}},
      {"layers.1", {layout[e.layers[1].attn_norm].offset, layout[e.final_norm].offset}},
      {"final", {layout[e.final_norm].offset, count}}};
  for (const auto& [name, range] : groups) {
    const size_t n = range.second - range.first;
    std::vector<uint16_t> bf16(n, 0x3f80);
    std::vector<float> moments(n, 9.f);
    ASSERT_TRUE((*writer)->Append(name + ".w", bf16.data(), n * 2).ok());
    ASSERT_TRUE((*writer)->Append("master." + name, master.data() + range.first, n * 4).ok());
    ASSERT_TRUE((*writer)->Append("opt.m." + name, moments.data(), n * 4).ok());
  }
  ASSERT_TRUE((*writer)->Commit().ok());
  hf::ExportOptions options;
  options.dtype = hf::Dtype::kF32;
  const std::string out = TempDir("exported");
  ASSERT_TRUE(ExportTrainerCheckpoint(config, dir, out, options).ok());
  auto reader = hf::HfCheckpointReader::Open(out, config);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<float> back(count);
  for (size_t i = 0; i < layout.size(); ++i) ASSERT_TRUE((*reader)->Read(i, back.data() + layout[i].offset).ok());
  EXPECT_EQ(back, master);
  // The same checkpoint as another model: refused, saying both shapes.
  ModelConfig other = config;
  other.kv_heads = 4;
  const absl::Status refused = ExportTrainerCheckpoint(other, dir, TempDir("refused"), options);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("is a checkpoint of a model with layers=2"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("give the run's model flags"), absl::string_view::npos) << refused;
}

}  // namespace
}  // namespace tierd::trainer
