#include "trainer_ref/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "trainer_ref/checkpoint.h"
#include "trainer_ref/trainer_test_util.h"

namespace tierd::trainer {
namespace {

TEST(TrainerTest, TheTinyModelLearnsTheEmbeddedCorpus) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok()) << data.status();
  auto home = PlainHomeFor(config, Small());
  auto trainer = Trainer::Create(config, Small(), *data, *home);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const double before = *(*trainer)->ValidationLoss(4);
  EXPECT_NEAR(before, std::log(256.0), 0.2);
  for (int i = 0; i < 60; ++i) {
    auto r = (*trainer)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->skipped) << r->why;
  }
  const double after = *(*trainer)->ValidationLoss(4);
  std::printf("validation loss %.3f -> %.3f after 60 steps\n", before, after);
  EXPECT_LT(after, 0.6 * before) << "seed 3, 60 steps of 4 x 32 tokens";
}

// --data_seed changes the data order alone: the same initial weights (the same validation
// loss before any step), other batches (another first loss); naming --seed's own value
// changes nothing at all.
// Adafactor (no first moment; each matrix's second moment as its row and column means, a
// few per cent of AdamW's state) learns the corpus as AdamW does over the same 60 steps; its
// state is refused by an AdamW run by name and continues its own curve bit for bit; ZeRO-2,
// whose slices cut matrices, is refused with it.
TEST(TrainerTest, AdafactorLearnsTheCorpusWithAFactoredState) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions o = Small();
  o.adafactor = true;
  const HomeShape shape = HomeShapeFor(config, o);
  EXPECT_TRUE(shape.Of(Kind::kAdamV).empty());
  size_t state = 0, params = 0;
  for (const TensorLayout& t : shape.Of(Kind::kAdamM)) state += t.count;
  for (const TensorLayout& t : shape.layout) params += t.count;
  EXPECT_LT(state, params / 10);
  auto home = PlainHomeFor(config, o);
  auto trainer = Trainer::Create(config, o, *data, *home);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const double before = *(*trainer)->ValidationLoss(4);
  std::string saved;
  std::vector<double> losses;
  for (int i = 0; i < 60; ++i) {
    if (i == 40) saved = *(*trainer)->SaveState();
    auto r = (*trainer)->Step();
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->skipped) << r->why;
    if (i >= 40) losses.push_back(r->loss);
  }
  const double after = *(*trainer)->ValidationLoss(4);
  std::printf("adafactor: validation loss %.3f -> %.3f after 60 steps\n", before, after);
  EXPECT_LT(after, 0.6 * before) << "as AdamW's bound in TheTinyModelLearnsTheEmbeddedCorpus";
  auto again_home = PlainHomeFor(config, o);
  auto again = Trainer::Create(config, o, *data, *again_home);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->LoadState(saved).ok());
  for (int i = 40; i < 60; ++i) {
    auto r = (*again)->Step();
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->loss, losses[i - 40]) << "step " << i + 1;
  }
  auto adamw_home = PlainHomeFor(config, Small());
  auto adamw = Trainer::Create(config, Small(), *data, *adamw_home);
  ASSERT_TRUE(adamw.ok());
  const absl::Status refused = (*adamw)->LoadState(saved);
  EXPECT_NE(refused.message().find("the state's moments are Adafactor's; this run's are fp32"), absl::string_view::npos)
      << refused;
  TrainOptions zero2 = o;
  zero2.dp.zero2 = true;
  auto zero2_home = PlainHomeFor(config, o);
  EXPECT_EQ(Trainer::Create(config, zero2, *data, *zero2_home).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TrainerTest, TheDataSeedChangesTheBatchesAndNothingElse) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok()) << data.status();
  auto first_loss = [&](uint64_t data_seed, double* validation) {
    TrainOptions o = Small();
    o.data_seed = data_seed;
    auto home = PlainHomeFor(config, o);
    auto trainer = Trainer::Create(config, o, *data, *home);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    *validation = *(*trainer)->ValidationLoss(2);
    auto r = (*trainer)->Step();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->loss : 0.0;
  };
  double v_default = 0, v_same = 0, v_other = 0;
  const double by_default = first_loss(0, &v_default);
  const double same = first_loss(Small().seed, &v_same);
  const double other = first_loss(Small().seed + 1, &v_other);
  EXPECT_EQ(same, by_default);
  EXPECT_NE(other, by_default);
  EXPECT_EQ(v_other, v_default) << "the initial weights do not depend on the data seed";
}

// With fp32 and with 8-bit moments.
void CheckResume(bool moments_8bit) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions o = Small();
  o.grad_accum = 2;
  o.moments_8bit = moments_8bit;
  auto home_a = PlainHomeFor(config, o);
  auto straight = *Trainer::Create(config, o, *data, *home_a);
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) losses.push_back(straight->Step()->loss);
  auto home_b = PlainHomeFor(config, o);
  auto first = *Trainer::Create(config, o, *data, *home_b);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(first->Step()->loss, losses[i]);
  const std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") +
                          (moments_8bit ? "/resume8" : "/resume32");
  std::system(("mkdir -p " + dir).c_str());
  auto path = WriteCheckpoint(dir, first->step(), *first->SaveState());
  ASSERT_TRUE(path.ok()) << path.status();
  auto home_c = PlainHomeFor(config, o);
  auto resumed = *Trainer::Create(config, o, *data, *home_c);
  auto latest = LatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  auto payload = ReadCheckpoint(*latest);
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_TRUE(resumed->LoadState(*payload).ok());
  EXPECT_EQ(resumed->step(), 3);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(resumed->Step()->loss, losses[i]) << "step " << i + 1;
  EXPECT_EQ(*resumed->SaveState(), *straight->SaveState()) << "bit-exact: weights, moments, data order";
}

TEST(TrainerTest, ResumingFromAStateContinuesTheExactCurve) {
  CheckResume(/*moments_8bit=*/false);
  CheckResume(/*moments_8bit=*/true);
}

// A state's moments must be this run's: 8-bit into fp32 and back are refused, and so is a
// state of an earlier 8-bit format (the second moment itself, before it was kept as its root;
// blocks of 2048, before they were 256).
TEST(TrainerTest, AStateOfOtherMomentsIsRefusedByName) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions eight = Small(), fp32 = Small();
  eight.moments_8bit = true;
  auto home8 = PlainHomeFor(config, eight);
  auto home32 = PlainHomeFor(config, fp32);
  auto with8 = *Trainer::Create(config, eight, *data, *home8);
  auto with32 = *Trainer::Create(config, fp32, *data, *home32);
  ASSERT_TRUE(with8->Step().ok());
  const std::string state8 = *with8->SaveState();
  const absl::Status mixed = with32->LoadState(state8);
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mixed.message().find("the state's moments are 8-bit; this run's are fp32"), absl::string_view::npos)
      << mixed;
  ASSERT_TRUE(with32->Step().ok());
  const absl::Status back = with8->LoadState(*with32->SaveState());
  EXPECT_NE(back.message().find("the state's moments are fp32; this run's are 8-bit"), absl::string_view::npos)
      << back;
  // The header: magic (4), step (8), batches drawn (8), parameters (8), then the format (4).
  std::string first_format = state8;
  const uint32_t one = 1;
  std::memcpy(first_format.data() + 28, &one, 4);
  const absl::Status old = with8->LoadState(first_format);
  EXPECT_EQ(old.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(old.message().find("earlier 8-bit format (the second moment itself"), absl::string_view::npos) << old;
  // The root's format in blocks of 2048, before the blocks were 256.
  const uint32_t two = 2;
  std::memcpy(first_format.data() + 28, &two, 4);
  const absl::Status blocks = with8->LoadState(first_format);
  EXPECT_EQ(blocks.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(blocks.message().find("earlier 8-bit format (blocks of 2048; this build quantizes in blocks of 256)"),
            absl::string_view::npos)
      << blocks;
  EXPECT_TRUE(with8->LoadState(state8).ok()) << "its own state loads";
}

// A state saved with a sparse sync (residuals), or in another sparse mode, or with Lion (one
// moment) is refused by a run without, naming what differs; a state of the format before data parallelism (no ranks in
// its header) still loads into a one-process run, bit for bit.
TEST(TrainerTest, AStateOfAnotherSyncOrOptimizerIsRefusedAndTheOldFormatLoads) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions dense = Small(), sparse = Small(), lion = Small();
  sparse.dp.sparse_ratio = 0.05;
  lion.lion = true;
  auto dense_home = PlainHomeFor(config, dense), sparse_home = PlainHomeFor(config, sparse),
       lion_home = PlainHomeFor(config, lion);
  auto with_dense = *Trainer::Create(config, dense, *data, *dense_home);
  auto with_sparse = *Trainer::Create(config, sparse, *data, *sparse_home);
  auto with_lion = *Trainer::Create(config, lion, *data, *lion_home);
  ASSERT_TRUE(with_sparse->Step().ok());
  const absl::Status from_sparse = with_dense->LoadState(*with_sparse->SaveState());
  EXPECT_EQ(from_sparse.message(),
            "the state is rank 0 of 1, sparse sync of gradients; this run is rank 0 of 1: resume with the ranks and "
            "sync it was saved with");
  // The momentum mode's moments are each rank's own: another sparse mode must not take them.
  TrainOptions momentum = sparse;
  momentum.dp.sparse_momentum = true;
  momentum.dp.sparse_warmup = 1;
  auto momentum_home = PlainHomeFor(config, momentum);
  auto with_momentum = *Trainer::Create(config, momentum, *data, *momentum_home);
  ASSERT_TRUE(with_momentum->Step().ok());
  ASSERT_TRUE(with_momentum->Step().ok());  // past the warm-up
  const absl::Status from_momentum = with_sparse->LoadState(*with_momentum->SaveState());
  EXPECT_NE(from_momentum.message().find("the state is rank 0 of 1, sparse sync of momenta; this run is rank 0 of 1, "
                                         "sparse sync of gradients"),
            absl::string_view::npos)
      << from_momentum;
  ASSERT_TRUE(with_lion->Step().ok());
  const absl::Status from_lion = with_dense->LoadState(*with_lion->SaveState());
  EXPECT_NE(from_lion.message().find("the state's moments are Lion's; this run's are fp32"), absl::string_view::npos)
      << from_lion;
  // The first format: magic "trs3" and no data-parallel header (12 bytes after the format).
  ASSERT_TRUE(with_dense->Step().ok());
  const std::string now = *with_dense->SaveState();
  std::string old = now.substr(0, 32) + now.substr(44);
  const uint32_t v3 = 0x74727333;
  std::memcpy(old.data(), &v3, 4);
  auto home = PlainHomeFor(config, dense);
  auto resumed = *Trainer::Create(config, dense, *data, *home);
  ASSERT_TRUE(resumed->LoadState(old).ok());
  EXPECT_EQ(*resumed->SaveState(), now);
}

TEST(TrainerTest, ANonFiniteGradientSkipsTheStepAndSaysWhere) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  const TrainOptions o = Small();
  auto home = PlainHomeFor(config, o);
  auto trainer = *Trainer::Create(config, o, *data, *home);
  const std::string before = *trainer->SaveState();
  {
    auto view = TensorHome::Over(HomeShapeFor(config, o), *home);
    ASSERT_TRUE(view.ok()) << view.status();
    auto wq = view->Acquire(2, Kind::kParam, Access::kWrite);  // layers.0.attn.wq
    ASSERT_TRUE(wq.ok());
    (*wq)[5] = NAN;
    ASSERT_TRUE(view->Release(2, Kind::kParam).ok());
  }
  const std::string poisoned = *trainer->SaveState();
  auto r = trainer->Step();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->skipped);
  EXPECT_NE(r->why.find("loss"), std::string::npos) << r->why;  // a NaN weight poisons the loss first
  std::string after = *trainer->SaveState();
  // The step counter moved on; weights and moments did not (bytes after the 28-byte header).
  EXPECT_EQ(after.substr(28), poisoned.substr(28)) << "a skipped step changes nothing";
  EXPECT_NE(before.substr(28), poisoned.substr(28));
}

// A home that stops serving after some acquires (tierd gone, say).
class FailingHome final : public Home {
 public:
  FailingHome(std::unique_ptr<Home> inner, int allowed) : inner_(std::move(inner)), allowed_(allowed) {}
  const HomeTable& table() const override { return inner_->table(); }
  bool Holds(Place place) const override { return inner_->Holds(place); }
  absl::StatusOr<void*> Acquire(size_t index, Access access, Place place) override {
    if (allowed_-- <= 0) return absl::UnavailableError("tierd went away");
    return inner_->Acquire(index, access, place);
  }
  absl::Status Release(size_t index, void* stream) override { return inner_->Release(index, stream); }
  std::string Describe() override { return "failing"; }

 private:
  std::unique_ptr<Home> inner_;
  int allowed_;
};

TEST(TrainerTest, AHomeThatFailsMidStepEndsTheStepWithItsError) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  const size_t entries = ParamLayout(config).size();
  const TrainOptions o = Small();
  // Init takes 4 per tensor, zeroing the gradients 1 more; then the forward pass runs out.
  FailingHome home(PlainHomeFor(config, o), static_cast<int>(5 * entries + 3));
  auto trainer = Trainer::Create(config, Small(), *data, home);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto r = (*trainer)->Step();
  ASSERT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("tierd went away"), absl::string_view::npos);
  FailingHome refuses_at_once(PlainHomeFor(config, o), 0);
  EXPECT_EQ(Trainer::Create(config, Small(), *data, refuses_at_once).status().code(),
            absl::StatusCode::kUnavailable);
}

// A home is made for one trainer's tensors: a trainer with other options (8-bit moments are
// smaller) refuses it, naming the first tensor that differs, and writes nothing into it.
TEST(TrainerTest, AHomeMadeForOtherOptionsIsRefused) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions eight = Small();
  eight.moments_8bit = true;
  auto home = PlainHomeFor(config, Small());
  auto refused = Trainer::Create(config, eight, *data, *home);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("the home was made for another layout"), absl::string_view::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("opt.m."), absl::string_view::npos) << refused.status();
  auto p = home->Acquire(0, Access::kRead, Place::kHost);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(static_cast<float*>(*p)[0], 0.f) << "nothing was written";
}

// The step graph the trainer registers has the ops the trainer reports, at the indices it
// reports them, and is a valid graph for the planner.
TEST(TrainerTest, TheStepGraphMatchesTheOpsTheTrainerReports) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions o = Small();
  o.grad_accum = 3;
  auto home = PlainHomeFor(config, o);
  auto trainer = *Trainer::Create(config, o, *data, *home);
  const prefetcher::Graph g = trainer->StepGraph();
  ASSERT_TRUE(prefetcher::ValidateGraph(g).ok()) << prefetcher::ValidateGraph(g);
  const auto& layout = trainer->layout();
  const int groups = config.layers + 2;
  EXPECT_EQ(g.ops.size(), 3 * layout.size() + 3u * 2 * groups);
  EXPECT_EQ(g.tensors.size(), 4 * layout.size() + config.layers + 1);
  for (size_t e = 0; e < layout.size(); ++e) {
    EXPECT_EQ(g.ops[trainer->ZeroOp(e)].name, "zero." + layout[e].name);
    EXPECT_EQ(g.ops[trainer->ScaleOp(e)].name, "scale." + layout[e].name);
    EXPECT_EQ(g.ops[trainer->AdamOp(e)].name, "adamw." + layout[e].name);
  }
  for (int micro = 0; micro < 3; ++micro) {
    for (int group = 0; group < groups; ++group) {
      EXPECT_EQ(g.ops[trainer->GroupOp(micro, group, false)].name, "mb" + std::to_string(micro) + ".group" +
                                                                        std::to_string(group) + ".fwd");
      EXPECT_EQ(g.ops[trainer->GroupOp(micro, group, true)].name, "mb" + std::to_string(micro) + ".group" +
                                                                       std::to_string(group) + ".bwd");
    }
  }
  // Forward overwrites a layer's saved activations; backward reads them.
  const prefetcher::GraphOp& fwd = g.ops[trainer->GroupOp(0, 1, false)];
  const prefetcher::GraphOp& bwd = g.ops[trainer->GroupOp(0, 1, true)];
  ASSERT_EQ(fwd.overwrites.size(), 1u);
  EXPECT_EQ(g.tensors[fwd.overwrites[0]].name, "act.layers.0");
  EXPECT_NE(std::find(bwd.reads.begin(), bwd.reads.end(), fwd.overwrites[0]), bwd.reads.end());
  EXPECT_EQ(home->RegisterGraph(g).value(), "") << "plain buffers have no planner";
}

}  // namespace
}  // namespace tierd::trainer
