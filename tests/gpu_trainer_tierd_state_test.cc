// The GPU trainer through the real tierd (gpu_tierd_fixture.h), the state's other layouts: the
// GPU's update deferred, the compact state, the Llama family, FP8 weight codes from the host
// and from the GPU's optimizer, and a quota below one layer. Part of gpu_trainer_tierd_test (one binary to carry).

#include <filesystem>

#include "tests/gpu_tierd_fixture.h"
#include "trainer_ref/checkpoint.h"

namespace tierd {
namespace {

namespace tg = trainer::gpu;
using gpu_tierd_testing::GpuTierdTest;
using gpu_tierd_testing::TestConfig;
using gpu_tierd_testing::TrainSideBySide;

// FP8 matmuls at current scaling in every layer but the first (a bf16 layer reads its bf16
// part): the choice both sides of the FP8 weight codes tests make.
void UseFp8AtCurrentScalingButLayer0(tg::GpuModel& model, const trainer::ModelConfig& config) {
  tg::Fp8ScalingOptions current;
  current.delayed = false;
  std::vector<bool> fp8_layers(config.layers, true);
  fp8_layers[0] = false;
  EXPECT_TRUE(model.UseFp8(fp8_layers, current).ok());
}

// The GPU's AdamW deferred to the next forward (SetOptimizerDeferred: each group's update
// queued just before its next use), 8-bit moments, layer-major over 2 micro-batches, through
// tierd at a third of the state: the same training, bit for bit, as a plain model stepping
// every group at the end of the step one micro-batch after the other.
TEST_F(GpuTierdTest, TheGpuUpdateDeferredToTheNextForwardTrainsTheSame) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, micro = 2;
  auto deferred =
      OnTierd(config, batch, seq, {.checkpointing = true, .layer_major_micro_batches = micro, .moments_8bit = true});
  auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, {.checkpointing = true, .moments_8bit = true});
  ASSERT_NE(deferred, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  deferred->SetOptimizerDeferred(true);
  ASSERT_TRUE(deferred->InitParams(5).ok());
  ASSERT_TRUE((*plain)->InitParams(5).ok());
  auto note = deferred->RegisterStep(micro);
  ASSERT_TRUE(note.ok()) << note.status();
  TrainSideBySide(*deferred, **plain, config, batch, seq, /*steps=*/4,
                  "deferred GPU AdamW 8-bit layer-major on tierd, plain GPU AdamW 8-bit");
  std::printf("%s\n%s\n", note->c_str(), deferred->home().Describe().c_str());
}

// The compact state through tierd (bf16 gradients, no weights parts: each use of a layer's
// weights reads its master copy), with the GPU's update deferred, layer-major over 2
// micro-batches, at a third of the state in the GPU quota: the same training, bit for bit, as
// a plain compact model stepping at the end of each step.
TEST_F(GpuTierdTest, TheCompactStateTrainsThroughTierdAsOnPlainBuffers) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, micro = 2;
  const tg::StateOptions state{
      .checkpointing = true, .layer_major_micro_batches = micro, .moments_8bit = true, .compact = true};
  auto deferred = OnTierd(config, batch, seq, state);
  auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, state);
  ASSERT_NE(deferred, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  deferred->SetOptimizerDeferred(true);
  ASSERT_TRUE(deferred->InitParams(6).ok());
  ASSERT_TRUE((*plain)->InitParams(6).ok());
  auto note = deferred->RegisterStep(micro);
  ASSERT_TRUE(note.ok()) << note.status();
  TrainSideBySide(*deferred, **plain, config, batch, seq, /*steps=*/4,
                  "compact state, deferred GPU AdamW 8-bit layer-major on tierd; plain compact layer-major");
  std::printf("%s\n%s\n", note->c_str(), deferred->home().Describe().c_str());
  // The host's optimizer writes bf16 weights, which the compact state does not keep.
  deferred->SetOptimizerOnCpu(true);
  EXPECT_EQ(deferred->AdamWStep(1e-3, 9, trainer::AdamWOptions{}, 1.0).code(), absl::StatusCode::kFailedPrecondition);
}

// The Llama family through tierd: grouped-query attention (4 query heads of 64 over 2
// key/value heads), q/k/v biases, tied embeddings (the head acquires the embedding group's
// weights and gradients) and llama3 RoPE, the head's logits in chunks of 128 rows,
// layer-major over 2 micro-batches, with the GPU's update deferred or AdamW on the host: the
// same training, bit for bit, as the same model on plain buffers (layer-major too: tied, the
// embedding's gradient sums the head's and the embedding's in the step's order), and the
// registered graph names the embedding group's parts in the head's op.
TEST_F(GpuTierdTest, TheLlamaFamilyTrainsThroughTierdAsOnPlainBuffers) {
  trainer::ModelConfig config = TestConfig();
  config.heads = 4;
  config.kv_heads = 2;
  config.head_size = 64;
  config.qkv_bias = true;
  config.tied_embeddings = true;
  config.rope_theta = 500000;
  config.rope_scaling = {trainer::RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 32};
  const int batch = 4, seq = 128, micro = 2;
  for (const bool host : {false, true}) {
    const tg::StateOptions state{.checkpointing = true, .layer_major_micro_batches = micro, .head_rows = 128};
    auto tierd = OnTierd(config, batch, seq, state);
    auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, state);
    ASSERT_NE(tierd, nullptr);
    ASSERT_TRUE(plain.ok()) << plain.status();
    if (host) {
      tierd->SetOptimizerOnCpu(true);
    } else {
      tierd->SetOptimizerDeferred(true);
    }
    ASSERT_TRUE(tierd->InitParams(8).ok());
    ASSERT_TRUE((*plain)->InitParams(8).ok());
    auto note = tierd->RegisterStep(micro);
    ASSERT_TRUE(note.ok()) << note.status();
    const prefetcher::Graph graph = tierd->StepGraph(micro);
    bool head_reads_embedding = false;
    for (const auto& op : graph.ops) {
      if (op.name.rfind("final.", 0) != 0) continue;
      for (auto t : op.reads) head_reads_embedding |= graph.tensors[t].name == "embed.w";
    }
    EXPECT_TRUE(head_reads_embedding) << "tied: the head's op reads the embedding's weights";
    TrainSideBySide(*tierd, **plain, config, batch, seq, /*steps=*/3,
                    host ? "family on tierd with AdamW on the host; plain" : "family on tierd, deferred GPU AdamW; plain");
    std::printf("%s\n", tierd->home().Describe().c_str());
  }
}

// A GPU quota below what one step of the model holds at once (a layer's four parts while
// its parameters are set: weights, master weights and the two moments) fails with an error
// that names the part and says why, not a crash or a hang.
// FP8 weight codes written by the host's optimizer (--fp8_weight_codes): a model whose FP8
// layers read the codes the host made (layer-major, one layer left in bf16) trains bit for bit
// as one whose GPU makes its codes from the bf16 weights at current scaling (two micro-batches
// in turn): the host's codes are the GPU's bits. And the weights cost less over PCIe: with the
// whole state fitting the GPU quota, a step brings the coded layers' codes in instead of their
// bf16 weights (each model alone on the daemon, which counts every session's moves together).
TEST_F(GpuTierdTest, FP8WeightCodesFromTheHostTrainLikeTheGpusOwn) {
  int major = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major < 9) GTEST_SKIP() << "FP8 matmuls need compute capability 8.9 or later";
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, steps = 4;
  // The third: micro-batches in turn, the host writing the codes' transposes too, which each
  // micro-batch's backward reads instead of transposing the codes.
  const tg::StateOptions states[3] = {{.layer_major_micro_batches = 2, .fp8_weight_codes = true},
                                      {},
                                      {.fp8_weight_codes = true, .transposed_weight_codes = true}};
  auto make = [&](int m) -> std::unique_ptr<tg::GpuModel> {
    const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq, states[m]);
    const uint64_t bytes = layout.Total();
    auto home = tg::MakeTierdGpuHome(layout, Options(2 * bytes, 2 * bytes, 2 * bytes));
    EXPECT_TRUE(home.ok()) << home.status();
    if (!home.ok()) return nullptr;
    auto model = tg::GpuModel::Create(config, batch, seq, std::move(*home), states[m]);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    UseFp8AtCurrentScalingButLayer0(**model, config);
    (*model)->SetOptimizerOnCpu(true);
    EXPECT_TRUE((*model)->InitParams(12).ok());
    EXPECT_TRUE((*model)->RegisterStep(2).ok());
    return std::move(*model);
  };
  // Bytes into the GPU over steps 2 and 3 of a model alone.
  uint64_t in[2] = {0, 0};
  std::mt19937_64 rng(5);
  std::vector<int32_t> tokens(2 * batch * seq), targets(2 * batch * seq);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % config.vocab);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % config.vocab);
  for (int m = 0; m < 2; ++m) {
    std::unique_ptr<tg::GpuModel> model = make(m);
    ASSERT_NE(model, nullptr);
    uint64_t before = 0;
    for (int step = 1; step <= 3; ++step) {
      ASSERT_TRUE(model->FinishOptimizerStep().ok());
      auto moved = model->home().Moved();
      ASSERT_TRUE(moved.ok()) << moved.status();
      if (step == 2) before = moved->host_to_gpu;
      ASSERT_TRUE(model->ZeroGrads().ok());
      if (m == 0) {
        ASSERT_TRUE(model->ForwardBackwardLayerMajor(tokens.data(), targets.data()).ok());
      } else {
        for (int k = 0; k < 2; ++k) {
          ASSERT_TRUE(model->Forward(tokens.data() + k * batch * seq, targets.data() + k * batch * seq).ok());
          ASSERT_TRUE(model->Backward().ok());
        }
      }
      ASSERT_TRUE(model->AdamWStep(1e-3, step, trainer::AdamWOptions{}, 0.5).ok());
    }
    ASSERT_TRUE(model->FinishOptimizerStep().ok());
    auto moved = model->home().Moved();
    ASSERT_TRUE(moved.ok()) << moved.status();
    in[m] = moved->host_to_gpu - before;
  }
  const tg::GpuHomeLayout plain = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t coded_bf16 = (config.layers - 1) * plain.bytes[2][static_cast<int>(tg::Part::kWeights)];
  const uint64_t coded_codes = (config.layers - 1) * tg::GpuModel::WeightCodesBytes(config);
  std::printf(
      "host to GPU in steps 2-3: %s with host-made codes, %s without; the coded layers' weights: %s of codes, "
      "%s of bf16\n",
      FormatBytes(in[0]).c_str(), FormatBytes(in[1]).c_str(), FormatBytes(coded_codes).c_str(),
      FormatBytes(coded_bf16).c_str());
  // Two steps' saving is nominally twice the difference; what the planner prefetches for the
  // next step before the window closes, or had before it opened, blurs that by up to a step's
  // weights (H200: 3.68 MiB against 5.10, nominally 1.92 MiB apart), so at least one step's.
  EXPECT_LE(static_cast<double>(in[0] + coded_bf16 - coded_codes), static_cast<double>(in[1]));
  // The bits: side by side from the same initial weights.
  std::unique_ptr<tg::GpuModel> models[2] = {make(0), make(1)};
  ASSERT_NE(models[0], nullptr);
  ASSERT_NE(models[1], nullptr);
  EXPECT_EQ(models[0]->LayersReadingWeightCodes(), config.layers - 1);
  EXPECT_EQ(models[1]->LayersReadingWeightCodes(), 0);
  // The step graph has the coded layers read their codes part, the bf16 layer its bf16 part.
  const auto graph = models[0]->StepGraph(2);
  std::map<std::string, int> reads;
  for (const auto& op : graph.ops) {
    for (auto t : op.reads) ++reads[graph.tensors[t].name];
  }
  EXPECT_GT(reads["layers.3.w8"], 0);
  EXPECT_EQ(reads["layers.3.w"], 0);
  EXPECT_GT(reads["layers.0.w"], 0);
  EXPECT_EQ(reads.count("layers.0.w8"), 0u);
  // The host's step rewrites the codes whole, but only updates the bf16 weights no GPU op of a
  // coded layer reads: were they "overwritten", the plan would take them for dead between
  // steps and drop them (a checkpoint, a fall back to bf16 read them).
  std::set<std::string> host_writes, host_overwrites;
  for (const auto& op : graph.ops) {
    for (auto t : op.host_writes) host_writes.insert(graph.tensors[t].name);
    for (auto t : op.host_overwrites) host_overwrites.insert(graph.tensors[t].name);
  }
  EXPECT_EQ(host_writes.count("layers.3.w"), 1u);
  EXPECT_EQ(host_overwrites.count("layers.3.w"), 0u);
  EXPECT_EQ(host_overwrites.count("layers.3.w8"), 1u);
  EXPECT_EQ(host_overwrites.count("layers.0.w"), 1u);
  TrainSideBySide(*models[0], *models[1], config, batch, seq, steps,
                  "FP8 layers from host-made codes, layer-major; from the GPU's own codes");
  models[0].reset();  // the daemon's GPU budget holds two of these at a time
  models[1].reset();
  std::unique_ptr<tg::GpuModel> transposing = make(2), own = make(1);
  ASSERT_NE(transposing, nullptr);
  ASSERT_NE(own, nullptr);
  TrainSideBySide(*transposing, *own, config, batch, seq, steps,
                  "FP8 layers from host-made codes and transposes, micro-batches in turn; from the GPU's own codes");
}

// A checkpoint's records by name (the end record aside).
std::map<std::string, std::string> CheckpointRecords(tg::GpuModel& model, const std::string& dir) {
  std::map<std::string, std::string> records;
  std::filesystem::create_directories(dir);
  auto writer = trainer::CheckpointWriter::Create(dir, 1);
  EXPECT_TRUE(writer.ok()) << writer.status();
  if (!writer.ok()) return records;
  const absl::Status saved = model.SaveState(**writer);
  EXPECT_TRUE(saved.ok()) << saved;
  auto path = (*writer)->Commit();
  EXPECT_TRUE(path.ok()) << path.status();
  if (!saved.ok() || !path.ok()) return records;
  auto reader = trainer::CheckpointReader::Open(*path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return records;
  for (auto next = (*reader)->Peek(); next.ok() && next->first != "end"; next = (*reader)->Peek()) {
    std::string bytes(next->second, '\0');
    const absl::Status read = (*reader)->Read(next->first, bytes.data(), bytes.size());
    EXPECT_TRUE(read.ok()) << read;
    if (!read.ok()) break;
    records[next->first] = std::move(bytes);
  }
  return records;
}

// FP8 weight codes made by the GPU's optimizer (--fp8_weight_codes, the optimizer on the GPU):
// right after a group's update, from its new bf16 weights at current scaling, so the step's
// micro-batches share one conversion, and nothing reads the bf16 weights until the next update
// (the plan may drop them). At the step's end and deferred to the next forward, through tierd
// at a third of the state: the training is bit for bit that of the same FP8 layers making their
// own codes from the bf16 weights at current scaling; the checkpoint's weights are the same
// bytes (made again from the master copy, as the plan may have dropped them); the graph has the
// coded layers' forwards and backwards read only the codes, and the update overwrite both.
TEST_F(GpuTierdTest, FP8WeightCodesFromTheGpusOptimizerTrainLikeItsOwnCasts) {
  int major = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major < 9) GTEST_SKIP() << "FP8 matmuls need compute capability 8.9 or later";
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, steps = 3;
  // The update at the step's end, deferred, and deferred writing the codes' transposes too
  // (which each micro-batch's backward then reads instead of transposing the codes itself).
  for (const auto& [deferred, transposed] : {std::pair{false, false}, {true, false}, {true, true}}) {
    SCOPED_TRACE(::testing::Message() << (deferred ? "deferred" : "at the step's end")
                                    << (transposed ? ", with transposes" : ""));
    auto make = [&](bool codes) -> std::unique_ptr<tg::GpuModel> {
      std::unique_ptr<tg::GpuModel> model =
          OnTierd(config, batch, seq, {.fp8_weight_codes = codes, .transposed_weight_codes = codes && transposed});
      if (model == nullptr) return nullptr;
      UseFp8AtCurrentScalingButLayer0(*model, config);
      model->SetOptimizerDeferred(deferred);
      EXPECT_TRUE(model->InitParams(12).ok());
      auto note = model->RegisterStep(2);
      EXPECT_TRUE(note.ok()) << note.status();
      return model;
    };
    std::unique_ptr<tg::GpuModel> coded = make(true), plain = make(false);
    ASSERT_NE(coded, nullptr);
    ASSERT_NE(plain, nullptr);
    EXPECT_EQ(coded->LayersReadingWeightCodes(), config.layers - 1);
    EXPECT_EQ(plain->LayersReadingWeightCodes(), 0);
    const auto graph = coded->StepGraph(2);
    std::map<std::string, int> reads;
    std::set<std::string> update_overwrites;
    for (const auto& op : graph.ops) {
      for (auto t : op.reads) ++reads[graph.tensors[t].name];
      if (op.name == "adamw.layers.3") {
        for (auto t : op.overwrites) update_overwrites.insert(graph.tensors[t].name);
      }
    }
    EXPECT_EQ(reads["layers.3.w"], 0);
    EXPECT_GT(reads["layers.3.w8"], 0);
    EXPECT_GT(reads["layers.0.w"], 0);
    EXPECT_EQ(update_overwrites, (std::set<std::string>{"layers.3.w", "layers.3.w8"}));
    std::map<std::string, std::string> records[2];
    const std::string dir = ::testing::TempDir();
    TrainSideBySide(
        *coded, *plain, config, batch, seq, steps,
        deferred ? "codes from the GPU's deferred update; FP8 layers' own casts"
                 : "codes from the GPU's update; FP8 layers' own casts",
        [&] {
          records[0] = CheckpointRecords(*coded, dir + "/coded");
          records[1] = CheckpointRecords(*plain, dir + "/plain");
        });
    int compared = 0;
    for (const auto& [name, bytes] : records[1]) {
      if (name == "fp8" || name == "model") continue;  // the scales of the weights the codes replace; the shape
      ASSERT_EQ(records[0].count(name), 1u) << name;
      EXPECT_TRUE(records[0][name] == bytes) << name << " differs";
      ++compared;
    }
    EXPECT_GT(compared, 4 * config.layers);
    EXPECT_EQ(records[1].count("layers.3.w"), 1u) << "a coded layer's bf16 weights are among those compared";
    std::printf("%d checkpoint records the same bytes; %s\n", compared, coded->home().Describe().c_str());
  }
}

TEST_F(GpuTierdTest, AQuotaBelowOneLayerSaysSo) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t acts = layout.bytes[1][static_cast<int>(tg::Part::kActs)];
  auto home = tg::MakeTierdGpuHome(layout, Options(acts / 2, 2 * layout.Total(), 2 * layout.Total()));
  ASSERT_TRUE(home.ok()) << home.status();
  auto model = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  ASSERT_TRUE(model.ok()) << model.status();
  const absl::Status s = (*model)->InitParams(5);
  ASSERT_FALSE(s.ok());
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_NE(s.message().find("acquiring "), std::string::npos) << s;
  EXPECT_NE(s.message().find("layers.0"), std::string::npos) << s;  // the embedding's parts fit; layer 0's do not
}


}  // namespace
}  // namespace tierd
