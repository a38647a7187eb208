// The GPU home's layout without a GPU: how the optimizer's state is cut into sub-groups
// (chunks of whole 256-byte blocks that tile each part exactly), the names they are leased
// under, and a model refusing a home made for another layout.
#include "trainer_ref/gpu/gpu_home.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/model_config.h"

namespace tierd::trainer::gpu {
namespace {

// Every part's chunks, in order, tile [0, bytes) with no gap or overlap; optimizer state in
// at most state_chunks chunks starting on 256-byte boundaries, every other part in one.
void ExpectChunksTile(const GpuHomeLayout& layout) {
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) {
    for (int k = 0; k < kParts; ++k) {
      const Part part = Part(k);
      const uint64_t total = layout.bytes[g][k];
      const int chunks = layout.Chunks(g, part);
      ASSERT_GE(chunks, 1);
      if (!IsOptimizerState(part)) {
        EXPECT_EQ(chunks, 1) << layout.groups[g] << " part " << k;
      }
      EXPECT_LE(chunks, std::max(1, layout.state_chunks));
      uint64_t end = 0, smallest = total, largest = 0;
      for (int c = 0; c < chunks; ++c) {
        const GpuHomeLayout::Range r = layout.Chunk(g, part, c);
        EXPECT_EQ(r.offset, end) << layout.groups[g] << " part " << k << " chunk " << c;
        EXPECT_EQ(r.offset % 256, 0u);
        if (total > 0) {
          EXPECT_GT(r.bytes, 0u) << layout.groups[g] << " part " << k << " chunk " << c;
        }
        end = r.offset + r.bytes;
        if (c + 1 < chunks) {  // the last one may hold a partial block
          smallest = std::min(smallest, r.bytes);
          largest = std::max(largest, r.bytes);
        }
      }
      EXPECT_EQ(end, total) << layout.groups[g] << " part " << k;
      if (chunks > 2) {
        EXPECT_LE(largest - smallest, 256u) << "chunks of one part differ by at most a block";
      }
    }
  }
}

TEST(GpuHomeLayoutTest, OptimizerStateInSubGroupsTilesEachPartInAlignedChunks) {
  const ModelConfig config{"test6", 6, 128, 2, 352, 512, 128};
  for (int chunks : {1, 2, 3, 5, 16, 4096}) {
    GpuHomeLayout layout = GpuModel::HomeLayout(config, 4, 128);
    layout.state_chunks = chunks;
    SCOPED_TRACE(chunks);
    ExpectChunksTile(layout);
    // A layer holds 4 * 128^2 + 3 * 128 * 352 + 2 * 128 = 200,960 parameters: 3140 blocks
    // of 64 floats, so every count below that is met exactly.
    EXPECT_EQ(layout.Chunks(1, Part::kAdamM), std::min(chunks, 3140));
  }
  // The 7B shape: a layer's 772 MiB of master weights in 16 chunks of ~48 MiB.
  GpuHomeLayout big = GpuModel::HomeLayout(*ModelPreset("7b"), 2, 2048, {.checkpointing = true});
  big.state_chunks = 16;
  ExpectChunksTile(big);
  EXPECT_EQ(big.Chunks(1, Part::kMaster), 16);
  EXPECT_NEAR(static_cast<double>(big.Chunk(1, Part::kMaster, 0).bytes),
              big.bytes[1][static_cast<int>(Part::kMaster)] / 16.0, 256.0);
}

// A tierd session's quotas against the 13B state at 4 x 2 micro-batches (158 GiB with 8-bit
// moments): refused when they cannot hold it, a warning with the bytes to add when less than a
// tenth stays free (44 GiB of NVMe: what failed on the H200 box), nothing with 58 GiB.
TEST(GpuHomeLayoutTest, QuotasThatCannotHoldTheStateAreRefusedAndTightOnesWarned) {
  const GpuHomeLayout layout = GpuModel::HomeLayout(
      *ModelPreset("13b"), 4, 2048, {.checkpointing = true, .layer_major_micro_batches = 2, .moments_8bit = true});
  const uint64_t state = layout.Total();
  EXPECT_NEAR(static_cast<double>(state) / (1ull << 30), 158, 1.5);
  const uint64_t gpu = 19 * (1ull << 30), dram = 100 * (1ull << 30);
  auto refused = CheckQuotasHold(layout, gpu, dram, 20 * (1ull << 30));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("more than the session's quotas hold (GPU 19.0 GiB + DRAM 100 GiB + "
                                            "NVMe 20.0 GiB = 139 GiB): raise --tierd_nvme"),
            std::string::npos)
      << refused.status();
  auto tight = CheckQuotasHold(layout, gpu, dram, 44 * (1ull << 30));
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_NE(tight->find("offload: warning: the state (158 GiB) fills 97% of the session's quotas"), std::string::npos)
      << *tight;
  auto roomy = CheckQuotasHold(layout, gpu, dram, 58 * (1ull << 30));
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  EXPECT_EQ(*roomy, "");
}

// The compact state of the same 13B step: no weights parts, bf16 gradients, 4 bytes a
// parameter less (~48 GiB), so GPU 19 GiB + DRAM 100 GiB hold it with no NVMe at all.
TEST(GpuHomeLayoutTest, TheCompactStateOf13BFitsTheGpuAndDramQuotas) {
  const StateOptions full_state{.checkpointing = true, .layer_major_micro_batches = 2, .moments_8bit = true};
  StateOptions compact_state = full_state;
  compact_state.compact = true;
  const ModelConfig config = *ModelPreset("13b");
  const GpuHomeLayout full = GpuModel::HomeLayout(config, 4, 2048, full_state);
  const GpuHomeLayout layout = GpuModel::HomeLayout(config, 4, 2048, compact_state);
  EXPECT_TRUE(layout.compact);
  EXPECT_EQ(layout.TotalOf(Part::kWeights), 0u);
  EXPECT_EQ(2 * layout.TotalOf(Part::kGrads), full.TotalOf(Part::kGrads));
  for (Part part : {Part::kMaster, Part::kAdamM, Part::kAdamV, Part::kActs}) {
    EXPECT_EQ(layout.TotalOf(part), full.TotalOf(part));
  }
  EXPECT_EQ(full.Total() - layout.Total(), 4 * static_cast<uint64_t>(config.Params()));
  EXPECT_NEAR(static_cast<double>(layout.Total()) / (1ull << 30), 110, 1.5);
  auto room = CheckQuotasHold(layout, 19 * (1ull << 30), 100 * (1ull << 30), 0);
  EXPECT_TRUE(room.ok()) << room.status();
}

// 8-bit moments: each tensor's moment is Moment8bitBytes of its count, the group's the sum
// (a 7B layer's two moments ~0.4 GB instead of 1.6), and the state is one lease a part.
TEST(GpuHomeLayoutTest, EightBitMomentsTakeEachTensorsBlocksInOneLease) {
  const ModelConfig config = *ModelPreset("7b");
  GpuHomeLayout fp32 = GpuModel::HomeLayout(config, 4, 2048, {.checkpointing = true});
  GpuHomeLayout q8 = GpuModel::HomeLayout(config, 4, 2048, {.checkpointing = true, .moments_8bit = true});
  EXPECT_TRUE(q8.moments_8bit);
  const uint64_t c = config.d_model, f = config.d_ff;
  const uint64_t layer = 2 * Moment8bitBytes(c) + 4 * Moment8bitBytes(c * c) + 3 * Moment8bitBytes(c * f);
  for (Part part : {Part::kAdamM, Part::kAdamV}) {
    EXPECT_EQ(q8.bytes[1][static_cast<int>(part)], layer);
    EXPECT_EQ(q8.bytes[0][static_cast<int>(part)], Moment8bitBytes(uint64_t{32000} * c));  // the embedding
  }
  for (Part part : {Part::kWeights, Part::kMaster, Part::kGrads, Part::kActs}) {
    EXPECT_EQ(q8.TotalOf(part), fp32.TotalOf(part));
  }
  // ~1.0 byte a value and 4 bytes a block of q8::kQuantBlock, against 4 bytes a value.
  EXPECT_NEAR(static_cast<double>(q8.TotalOf(Part::kAdamM)) / fp32.TotalOf(Part::kAdamM),
              0.25 * (1 + 4.0 / q8::kQuantBlock), 1e-4);
  q8.state_chunks = 8;
  EXPECT_EQ(q8.Chunks(1, Part::kMaster), 1);
  EXPECT_EQ(q8.Chunks(1, Part::kAdamM), 1);
  ExpectChunksTile(q8);
}

TEST(GpuHomeLayoutTest, ChunksAreLeasedUnderNamesOfTheirOwn) {
  GpuHomeLayout layout;
  layout.groups = {"embed", "layers.0"};
  layout.bytes = {{512, 1024, 1024, 1024, 1024, 0}, {2000, 4000, 4000, 4000, 4000, 64}};
  EXPECT_EQ(PartName(layout, 1, Part::kAdamM), "opt.m.layers.0") << "one lease: the plain name";
  layout.state_chunks = 3;
  std::set<std::string> names;
  for (int g = 0; g < 2; ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (layout.bytes[g][k] == 0) continue;
      for (int c = 0; c < layout.Chunks(g, Part(k)); ++c) {
        EXPECT_TRUE(names.insert(PartName(layout, g, Part(k), c)).second) << PartName(layout, g, Part(k), c);
      }
    }
  }
  EXPECT_EQ(names.size(), 2u * (2 + 3 * 3) + 1);  // weights, grads, 3 x 3 state chunks; one acts part
  EXPECT_EQ(PartName(layout, 1, Part::kAdamM, 2), "opt.m.layers.0.2");
  EXPECT_EQ(PartName(layout, 1, Part::kMaster, 0), "master.layers.0.0");
  EXPECT_EQ(PartName(layout, 1, Part::kGrads), "grad.layers.0");
  EXPECT_EQ(PartName(layout, 0, Part::kWeights), "embed.w");
  // 4000 bytes: 16 blocks of 256 (the last partial) in 3 chunks of 6, 5 and 5 blocks.
  EXPECT_EQ(layout.Chunk(1, Part::kAdamV, 0).bytes, 6u * 256);
  EXPECT_EQ(layout.Chunk(1, Part::kAdamV, 1).offset, 6u * 256);
  EXPECT_EQ(layout.Chunk(1, Part::kAdamV, 2).bytes, 4000u - 11 * 256);
}

// A home that only has a table: enough for GpuModel::Create to look at before it touches
// the device.
class TableOnlyHome final : public Home {
 public:
  explicit TableOnlyHome(HomeTable table) : table_(std::move(table)) {}
  const HomeTable& table() const override { return table_; }
  bool Holds(Place) const override { return false; }
  absl::StatusOr<void*> Acquire(size_t, Access, Place) override { return absl::InternalError("not here"); }
  absl::Status Release(size_t, void*) override { return absl::OkStatus(); }
  std::string Describe() override { return "table only"; }

 private:
  HomeTable table_;
};

std::unique_ptr<GpuHome> LayoutOnlyHome(const GpuHomeLayout& layout) {
  return GpuHome::Over(layout, std::make_unique<TableOnlyHome>(layout.Table())).value();
}

// A home that records which of its tensors was asked for, where, and with which stream.
class RecordingHome final : public Home {
 public:
  explicit RecordingHome(HomeTable table) : table_(std::move(table)) {}
  const HomeTable& table() const override { return table_; }
  bool Holds(Place) const override { return true; }
  absl::StatusOr<void*> Acquire(size_t index, Access, Place place) override {
    last = table_.at(index).name;
    last_place = place;
    return reinterpret_cast<void*>(index + 1);
  }
  absl::Status Release(size_t index, void* stream) override {
    last = table_.at(index).name;
    last_stream = stream;
    return absl::OkStatus();
  }
  std::string Describe() override { return "recording"; }
  std::string last;
  Place last_place = Place::kHost;
  void* last_stream = nullptr;

 private:
  HomeTable table_;
};

// The layout's table holds every chunk of every part once, under its PartName, with its
// bytes; the model's (group, part, chunk) reaches exactly that tensor of the home, on the
// GPU or (for the host's optimizer) on the host, and its release carries the stream.
TEST(GpuHomeLayoutTest, EachChunkIsTheHomesTensorOfItsName) {
  const ModelConfig config{"test6", 6, 128, 2, 352, 512, 128};
  GpuHomeLayout layout = GpuModel::HomeLayout(config, 4, 128, {.fp8_weight_codes = true});
  layout.state_chunks = 3;
  const HomeTable table = layout.Table();
  EXPECT_EQ(TableBytes(table), layout.Total());
  auto owned = std::make_unique<RecordingHome>(table);
  RecordingHome* home = owned.get();
  auto view = GpuHome::Over(layout, std::move(owned));
  ASSERT_TRUE(view.ok()) << view.status();
  size_t chunks = 0;
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (layout.bytes[g][k] == 0) continue;
      for (int c = 0; c < layout.Chunks(g, Part(k)); ++c, ++chunks) {
        ASSERT_TRUE((*view)->Acquire(g, Part(k), c, Access::kRead).ok());
        EXPECT_EQ(home->last, PartName(layout, g, Part(k), c));
        EXPECT_EQ(home->last_place, Place::kGpu);
        ASSERT_TRUE((*view)->AcquireHost(g, Part(k), c, Access::kRead).ok());
        EXPECT_EQ(home->last_place, Place::kHost);
        ASSERT_TRUE((*view)->Release(g, Part(k), c, reinterpret_cast<cudaStream_t>(0x40)).ok());
        EXPECT_EQ(home->last_stream, reinterpret_cast<void*>(0x40));
        ASSERT_TRUE((*view)->ReleaseHost(g, Part(k), c).ok());
        EXPECT_EQ(home->last_stream, nullptr);
      }
    }
  }
  EXPECT_EQ(chunks, table.size());
  // A home of the same parts in other sub-groups is another table.
  GpuHomeLayout four = layout;
  four.state_chunks = 4;
  auto refused = GpuHome::Over(four, std::make_unique<RecordingHome>(table));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("the home was made for another layout"), std::string::npos)
      << refused.status();
  // A home without a host tier says so when the host's optimizer asks for one.
  auto table_only = LayoutOnlyHome(layout);
  EXPECT_FALSE(table_only->HasHostTier());
  EXPECT_EQ(table_only->AcquireHost(1, Part::kMaster, 0, Access::kRead).status().code(),
            absl::StatusCode::kUnimplemented);
}

// FP8 weight codes (--fp8_weight_codes): a part per layer, none for the embedding and the head,
// of a 16-byte scale slot per linear map and each map's codes 256-byte aligned: ~1 byte a
// weight of the layer's seven matrices, about half its bf16 part. Leased as "layers.3.w8".
// Not with the compact state, which keeps no bf16 weights for the host to write them from.
TEST(GpuHomeLayoutTest, FP8WeightCodesAreAPartPerLayerOfAByteAWeight) {
  const ModelConfig config{"test6", 6, 128, 2, 352, 512, 128};
  const GpuHomeLayout plain = GpuModel::HomeLayout(config, 4, 128);
  const GpuHomeLayout coded = GpuModel::HomeLayout(config, 4, 128, {.fp8_weight_codes = true});
  const int codes = static_cast<int>(Part::kWeightCodes);
  const uint64_t matrices = 4 * 128 * 128 + 3 * 128 * 352;
  EXPECT_EQ(GpuModel::WeightCodesBytes(config), 256 + matrices);  // every matrix a multiple of 256 here
  EXPECT_EQ(coded.bytes.front()[codes], 0u);
  EXPECT_EQ(coded.bytes.back()[codes], 0u);
  for (int g = 1; g <= config.layers; ++g) {
    EXPECT_EQ(coded.bytes[g][codes], GpuModel::WeightCodesBytes(config));
    EXPECT_EQ(plain.bytes[g][codes], 0u);
    EXPECT_LT(coded.bytes[g][codes], coded.bytes[g][static_cast<int>(Part::kWeights)] * 0.51);
  }
  EXPECT_EQ(coded.Total(), plain.Total() + config.layers * GpuModel::WeightCodesBytes(config));
  EXPECT_EQ(PartName(coded, 4, Part::kWeightCodes), "layers.3.w8");
  auto refused = GpuModel::Create(config, 4, 128, nullptr, {.compact = true, .fp8_weight_codes = true});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
}

// With their transposes (--fp8_transposed_weight_codes, for micro-batches in turn): each map's
// codes twice, a byte a weight more in the same part. Not without the codes themselves.
TEST(GpuHomeLayoutTest, FP8WeightCodesWithTheirTransposesTakeAByteAWeightMore) {
  const ModelConfig config{"test6", 6, 128, 2, 352, 512, 128};
  const GpuHomeLayout coded = GpuModel::HomeLayout(config, 4, 128, {.fp8_weight_codes = true});
  const GpuHomeLayout both =
      GpuModel::HomeLayout(config, 4, 128, {.fp8_weight_codes = true, .transposed_weight_codes = true});
  const int codes = static_cast<int>(Part::kWeightCodes);
  const uint64_t matrices = 4 * 128 * 128 + 3 * 128 * 352;
  EXPECT_EQ(GpuModel::WeightCodesBytes(config, /*transposed=*/true), 256 + 2 * matrices);
  for (int g = 1; g <= config.layers; ++g) EXPECT_EQ(both.bytes[g][codes], 256 + 2 * matrices);
  EXPECT_EQ(both.bytes.front()[codes], 0u);
  EXPECT_EQ(both.Total(), coded.Total() + config.layers * matrices);
  auto refused = GpuModel::Create(config, 4, 128, nullptr, {.transposed_weight_codes = true});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--fp8_weight_codes"), std::string::npos) << refused.status();
}

// FP8 layers that keep their activations (StateOptions::fp8_layers) keep h1, h2 and s as their
// codes: rooms of a byte an element, not two. Lean and recomputing layers, and bf16 ones, keep
// theirs as before; the workspace then holds a lean layer's element-wise outputs, for an FP8
// layer that runs bf16 in rooms for codes.
TEST(GpuHomeLayoutTest, FP8LayersKeepTheirMapsInputsInRoomsOfAByteAnElement) {
  const ModelConfig config{"test6", 6, 128, 2, 352, 512, 128};
  const int batch = 4, seq = 128;
  const uint64_t n = batch * seq, halved = 2 * n * 128 + n * 352;  // h1, h2, s: a byte an element less
  const int acts = static_cast<int>(Part::kActs);
  const std::vector<bool> all(config.layers, true);
  const GpuHomeLayout bf16 = GpuModel::HomeLayout(config, batch, seq);
  const GpuHomeLayout coded = GpuModel::HomeLayout(config, batch, seq, {.fp8_layers = all});
  for (int g = 1; g <= config.layers; ++g) EXPECT_EQ(coded.bytes[g][acts], bf16.bytes[g][acts] - halved) << g;
  // Layer 5 in bf16 (--bf16_layers): its rooms as before.
  std::vector<bool> but_last = all;
  but_last[5] = false;
  const GpuHomeLayout mixed = GpuModel::HomeLayout(config, batch, seq, {.fp8_layers = but_last});
  EXPECT_EQ(mixed.bytes[6][acts], bf16.bytes[6][acts]);
  EXPECT_EQ(mixed.bytes[5][acts], coded.bytes[5][acts]);
  // Checkpointing: the last 2 keep (coded), the 2 before them keep lean, the rest their input.
  const StateOptions dynamic{.checkpointing = true, .kept_layers = 2, .lean_layers = 2};
  StateOptions dynamic_coded = dynamic;
  dynamic_coded.fp8_layers = all;
  const GpuHomeLayout checkpointed = GpuModel::HomeLayout(config, batch, seq, dynamic);
  const GpuHomeLayout checkpointed_coded = GpuModel::HomeLayout(config, batch, seq, dynamic_coded);
  for (int g = 1; g <= config.layers; ++g) {
    EXPECT_EQ(checkpointed_coded.bytes[g][acts], checkpointed.bytes[g][acts] - (g >= 5 ? halved : 0)) << g;
  }
  // The workspace: room for a lean layer's h1, h2, s and norm statistics where no layer
  // recomputes (else the recompute workspace's serves).
  const uint64_t lean_rooms = 2 * n * 128 * 2 + n * 352 * 2 + 2 * n * 4;
  EXPECT_EQ(GpuModel::WorkspaceBytesFor(config, batch, seq, {.fp8_layers = all}),
            GpuModel::WorkspaceBytesFor(config, batch, seq) + lean_rooms + 1);  // and xr_'s empty stand-in, a byte
  EXPECT_EQ(GpuModel::WorkspaceBytesFor(config, batch, seq, dynamic_coded),
            GpuModel::WorkspaceBytesFor(config, batch, seq, dynamic));
}

TEST(GpuHomeLayoutTest, AModelRefusesAHomeMadeForAnotherLayout) {
  const ModelConfig config{"test6", 6, 128, 2, 352, 512, 128};
  GpuHomeLayout other = GpuModel::HomeLayout(config, 4, 64);  // another sequence length: other activations
  auto model = GpuModel::Create(config, 4, 128, LayoutOnlyHome(other));
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("the home was made for another layout"), std::string::npos) << model.status();
}

}  // namespace
}  // namespace tierd::trainer::gpu
