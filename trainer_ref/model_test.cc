#include "trainer_ref/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace tierd::trainer {
namespace {

ModelConfig Small() { return ModelConfig{"check", 2, 8, 2, 12, 11, 5}; }

std::vector<int32_t> Tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST(ModelTest, LayoutNamesEveryTensorOnceInOrder) {
  const auto layout = ParamLayout(*ModelPreset("tiny"));
  EXPECT_EQ(layout.front().name, "embed.w");
  EXPECT_EQ(layout[2].name, "layers.0.attn.wq");
  EXPECT_EQ(layout.back().name, "head.w");
  size_t offset = 0;
  for (const TensorLayout& t : layout) {
    EXPECT_EQ(t.offset, offset) << t.name;
    offset += t.count;
  }
  EXPECT_EQ(offset, ModelPreset("tiny")->Params());
}

// The Llama family's variations on Small(): grouped-query attention (2 key/value heads of 4),
// a head size other than C / H, q/k/v biases, tied embeddings, llama3-scaled RoPE.
ModelConfig Family() {
  ModelConfig c{"family", 2, 8, 4, 12, 11, 5};
  c.kv_heads = 2;
  c.head_size = 4;  // q: 16 wide, k and v: 8
  c.qkv_bias = true;
  c.tied_embeddings = true;
  c.rope_theta = 500;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 4.0, 1.0, 4.0, 2};
  return c;
}

TEST(ModelTest, TheFamilysLayoutHasBiasesNarrowKeysAndNoHead) {
  const ModelConfig c = Family();
  ASSERT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
  const auto layout = ParamLayout(c);
  const ParamEntries e = ParamEntriesOf(c);
  EXPECT_EQ(layout[e.layers[0].wq].shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(layout[e.layers[0].wk].shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(layout[e.layers[0].wo].shape, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(layout[e.layers[1].bv].name, "layers.1.attn.bv");
  EXPECT_TRUE(IsBias(layout[e.layers[1].bv]));
  EXPECT_EQ(e.head, e.embed) << "tied: the head is the embedding's matrix";
  EXPECT_EQ(layout.back().name, "final_norm.w");
  EXPECT_EQ(layout.back().offset + layout.back().count, c.Params());
}

// The groups every trainer leases by: each entry in exactly one, in layout order; the head in
// "final" untied, in "embed" (its matrix) tied; a layer's biases in its group.
TEST(ModelTest, ParamGroupsCoverTheLayoutInOrder) {
  for (const ModelConfig& c : {*ModelPreset("tiny"), Family()}) {
    const std::vector<ParamGroup> groups = ParamGroups(c);
    const auto layout = ParamLayout(c);
    ASSERT_EQ(groups.size(), static_cast<size_t>(c.layers + 2));
    EXPECT_EQ(groups[0].name, "embed");
    EXPECT_EQ(groups[1].name, "layers.0");
    EXPECT_EQ(groups.back().name, "final");
    size_t next = 0;
    for (const ParamGroup& g : groups) {
      for (size_t e : g.entries) EXPECT_EQ(e, next++) << g.name;
    }
    EXPECT_EQ(next, layout.size());
    EXPECT_EQ(groups.back().entries.size(), c.tied_embeddings ? 1u : 2u);
    EXPECT_EQ(groups[2].entries.size(), c.qkv_bias ? 12u : 9u);
  }
}

// The whole model's gradient (every parameter) against central differences, in double: the
// plain model, the family's variations, and the head's logits in chunks of 3 rows.
class ModelGradientTest : public ::testing::TestWithParam<int> {};

TEST_P(ModelGradientTest, WholeModelGradientMatchesFiniteDifferences) {
  const ModelConfig config = GetParam() == 0 ? Small() : Family();
  const int batch = 2, seq = 5, n = batch * seq;
  Model<double> model(config, batch, seq, /*checkpointing=*/false,
                      GetParam() == 2 ? 3 * static_cast<size_t>(config.vocab) : kLogitsChunkElements);
  model.InitParams(7);
  // Larger weights than the init so every path carries signal.
  std::mt19937_64 rng(8);
  std::normal_distribution<double> normal(0, 0.3);
  for (double& p : model.params()) p += normal(rng);
  const std::vector<int32_t> tokens = Tokens(n, config.vocab, 9);
  std::vector<int32_t> targets = Tokens(n, config.vocab, 10);
  targets[3] = -1;  // one ignored position
  model.ZeroGrads();
  model.Forward(tokens.data(), targets.data());
  model.Backward();
  const std::vector<double> analytic = model.grads();
  const double eps = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < model.params().size(); ++i) {
    double& p = model.params()[i];
    const double saved = p;
    p = saved + eps;
    const double up = model.Forward(tokens.data(), targets.data());
    p = saved - eps;
    const double down = model.Forward(tokens.data(), targets.data());
    p = saved;
    const double numeric = (up - down) / (2 * eps);
    const double error = std::abs(analytic[i] - numeric) / std::max(1e-3, std::abs(numeric));
    worst = std::max(worst, error);
    ASSERT_NEAR(analytic[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "parameter " << i;
  }
  std::printf("worst relative error over %zu parameters: %.3g\n", model.params().size(), worst);
}

INSTANTIATE_TEST_SUITE_P(PlainFamilyAndChunkedHead, ModelGradientTest, ::testing::Values(0, 1, 2));

// The head's logits a chunk of rows at a time give the whole head's loss and gradients, bit
// for bit (the same sums in the same order), and the saved head then keeps no logits.
TEST(ModelTest, ChunkedLogitsGiveTheWholeHeadsBits) {
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 16, n = batch * seq;
  const size_t chunk = 5 * static_cast<size_t>(config.vocab);  // 5 rows: 7 chunks, the last partial
  Model<float> whole(config, batch, seq), chunked(config, batch, seq, false, chunk);
  whole.InitParams(3);
  chunked.InitParams(3);
  const std::vector<int32_t> tokens = Tokens(n, config.vocab, 31);
  std::vector<int32_t> targets = Tokens(n, config.vocab, 32);
  targets[7] = -1;
  whole.ZeroGrads();
  chunked.ZeroGrads();
  EXPECT_EQ(whole.Forward(tokens.data(), targets.data()), chunked.Forward(tokens.data(), targets.data()));
  whole.Backward();
  chunked.Backward();
  EXPECT_EQ(whole.grads(), chunked.grads());
  EXPECT_EQ(chunked.saved_layout().back().count + static_cast<size_t>(n) * config.vocab,
            whole.saved_layout().back().count);
}

TEST(ModelTest, InitialLossIsAboutLogVocabAndGradientDescentLowersIt) {
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 16, n = batch * seq;
  Model<float> model(config, batch, seq);
  model.InitParams(1);
  // A sequence that repeats: the next token is predictable.
  std::vector<int32_t> tokens(n), targets(n);
  for (int i = 0; i < n; ++i) {
    tokens[i] = (i * 7) % 13;
    targets[i] = ((i + 1) * 7) % 13;
  }
  const float first = model.Forward(tokens.data(), targets.data());
  EXPECT_NEAR(first, std::log(static_cast<float>(config.vocab)), 0.1);
  float loss = first;
  for (int step = 0; step < 30; ++step) {
    model.ZeroGrads();
    loss = model.Forward(tokens.data(), targets.data());
    model.Backward();
    for (size_t i = 0; i < model.params().size(); ++i) model.params()[i] -= 0.5f * model.grads()[i];
  }
  EXPECT_LT(loss, 0.5f * first) << "30 steps of plain gradient descent on a repeating sequence";
}

// Tensors kept elsewhere (as tierd keeps them): parameters, gradients and saved
// activations bound per group as forward and backward reach it, unbound when they leave.
// Same loss, same gradients, groups visited in order; with activation checkpointing (each
// layer keeps only its input and backward recomputes the rest) the gradients are the same
// bit for bit, and the saved tensors are a layer's input only.
void CheckBoundElsewhere(bool checkpointing) {
  const ModelConfig config = Small();
  const int batch = 2, seq = 5, n = batch * seq;
  const std::vector<int32_t> tokens = Tokens(n, config.vocab, 21), targets = Tokens(n, config.vocab, 22);
  Model<double> plain(config, batch, seq), bound(config, batch, seq, checkpointing);
  plain.InitParams(4);
  bound.InitParams(4);
  // "Elsewhere": one separate buffer per tensor, filled from the flat init.
  std::vector<std::vector<double>> home_p, home_g, home_saved;
  for (const TensorLayout& t : bound.layout()) {
    home_p.emplace_back(bound.params().begin() + t.offset, bound.params().begin() + t.offset + t.count);
    home_g.emplace_back(t.count, 0.0);
  }
  const std::vector<TensorLayout> saved = SavedLayout(config, batch, seq, checkpointing);
  ASSERT_EQ(saved.size(), static_cast<size_t>(config.layers + 1));
  EXPECT_EQ(saved[0].name, "act.layers.0");
  EXPECT_EQ(saved.back().name, "act.head");
  if (checkpointing) {
    EXPECT_EQ(saved[0].count, static_cast<size_t>(n) * config.d_model);
  }
  else EXPECT_GT(saved[0].count, 10u * n * config.d_model);
  for (const TensorLayout& t : saved) home_saved.emplace_back(t.count, std::nan(""));
  std::fill(bound.params().begin(), bound.params().end(), std::nan(""));  // the flat copy must not be used
  std::vector<std::pair<int, bool>> visits;
  bound.SetGroupHooks(
      [&](int group, bool backward) {
        visits.push_back({group, backward});
        for (size_t e : bound.GroupEntries(group)) bound.Bind(e, home_p[e].data(), home_g[e].data());
        if (int s = bound.SavedOf(group); s >= 0) bound.BindSaved(s, home_saved[s].data());
      },
      [&](int group, bool) {
        for (size_t e : bound.GroupEntries(group)) bound.Bind(e, nullptr, nullptr);  // any use now would crash
        if (int s = bound.SavedOf(group); s >= 0) bound.BindSaved(s, nullptr);
      });
  plain.ZeroGrads();
  const double a = plain.Forward(tokens.data(), targets.data());
  plain.Backward();
  const double b = bound.Forward(tokens.data(), targets.data());
  bound.Backward();
  EXPECT_EQ(a, b);
  for (size_t e = 0; e < bound.layout().size(); ++e) {
    const TensorLayout& t = bound.layout()[e];
    for (size_t i = 0; i < t.count; ++i) ASSERT_EQ(home_g[e][i], plain.grads()[t.offset + i]) << t.name;
  }
  for (size_t s = 0; s < saved.size(); ++s) {  // forward wrote every element (no NaN left)
    for (double x : home_saved[s]) ASSERT_FALSE(std::isnan(x)) << saved[s].name;
  }
  const int last = config.layers + 1;
  ASSERT_EQ(visits.size(), 2u * (last + 1));
  for (int gi = 0; gi <= last; ++gi) EXPECT_EQ(visits[gi], std::make_pair(gi, false));
  for (int gi = 0; gi <= last; ++gi) EXPECT_EQ(visits[last + 1 + gi], std::make_pair(last - gi, true));
}

TEST(ModelTest, TensorsBoundElsewhereGroupByGroupGiveTheSameResults) { CheckBoundElsewhere(false); }

TEST(ModelTest, ActivationCheckpointingGivesTheSameGradientsBitForBit) { CheckBoundElsewhere(true); }

// The index of every tensor in ParamLayout's order, as the CPU and the GPU models use it.
// Layer-major order: the same losses and gradients, bit for bit, as one micro-batch after the
// other (each gradient accumulates in micro-batch order either way), and every group entered
// once per pass — forward, then the head, then backward — whatever the number of
// micro-batches.
void CheckLayerMajor(bool checkpointing) {
  const ModelConfig config = Small();
  const int batch = 2, seq = 5, n = batch * seq, micro = 3;
  const std::vector<int32_t> tokens = Tokens(micro * n, config.vocab, 31), targets = Tokens(micro * n, config.vocab, 32);
  Model<float> one_by_one(config, batch, seq, checkpointing), layer_major(config, batch, seq, checkpointing);
  one_by_one.InitParams(6);
  layer_major.InitParams(6);
  one_by_one.ZeroGrads();
  layer_major.ZeroGrads();
  std::vector<float> want;
  for (int m = 0; m < micro; ++m) {
    want.push_back(one_by_one.Forward(tokens.data() + m * n, targets.data() + m * n));
    one_by_one.Backward();
  }
  std::vector<std::pair<int, bool>> visits;
  layer_major.SetGroupHooks([&](int group, bool backward) { visits.push_back({group, backward}); }, nullptr);
  const std::vector<float> got = layer_major.ForwardBackwardLayerMajor(tokens.data(), targets.data(), micro);
  EXPECT_EQ(got, want);
  ASSERT_EQ(layer_major.grads().size(), one_by_one.grads().size());
  for (size_t i = 0; i < one_by_one.grads().size(); ++i) {
    ASSERT_EQ(layer_major.grads()[i], one_by_one.grads()[i]) << "gradient element " << i;
  }
  const int last = config.layers + 1;
  std::vector<std::pair<int, bool>> order;
  for (int g = 0; g < last; ++g) order.push_back({g, false});
  order.push_back({last, true});
  for (int g = last; g-- > 0;) order.push_back({g, true});
  EXPECT_EQ(visits, order);
}

TEST(ModelTest, LayerMajorOrderGivesTheSameLossesAndGradientsBitForBit) {
  CheckLayerMajor(/*checkpointing=*/true);
  CheckLayerMajor(/*checkpointing=*/false);
}

TEST(ModelTest, ParamEntriesNameTheLayoutsTensors) {
  const ModelConfig config = Small();
  const std::vector<TensorLayout> layout = ParamLayout(config);
  const ParamEntries e = ParamEntriesOf(config);
  EXPECT_EQ(layout[e.embed].name, "embed.w");
  EXPECT_EQ(layout[e.final_norm].name, "final_norm.w");
  EXPECT_EQ(layout[e.head].name, "head.w");
  ASSERT_EQ(e.layers.size(), static_cast<size_t>(config.layers));
  const LayerEntries& last = e.layers.back();
  const std::string p = "layers." + std::to_string(config.layers - 1) + ".";
  EXPECT_EQ(layout[last.attn_norm].name, p + "attn_norm.w");
  EXPECT_EQ(layout[last.wq].name, p + "attn.wq");
  EXPECT_EQ(layout[last.wo].name, p + "attn.wo");
  EXPECT_EQ(layout[last.mlp_norm].name, p + "mlp_norm.w");
  EXPECT_EQ(layout[last.w3].name, p + "mlp.w3");
  EXPECT_EQ(layout[last.w2].name, p + "mlp.w2");
  EXPECT_EQ(e.head + 1, layout.size());
}

}  // namespace
}  // namespace tierd::trainer
