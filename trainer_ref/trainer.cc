#include "trainer_ref/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adafactor.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/host_lion.h"

namespace tierd::trainer {
namespace {

// Acquires some of an entry's tensors, releases them all when it goes out of scope.
class Held {
 public:
  Held(TensorHome& home, size_t entry) : home_(home), entry_(entry) {}
  ~Held() {
    for (Kind k : kinds_) home_.Release(entry_, k).IgnoreError();
  }
  absl::StatusOr<float*> Get(Kind kind, Access access) {
    auto p = home_.Acquire(entry_, kind, access);
    if (p.ok()) kinds_.push_back(kind);
    return p;
  }

 private:
  TensorHome& home_;
  size_t entry_;
  std::vector<Kind> kinds_;
};

constexpr uint32_t kStateMagic = 0x74727334;    // "trs4": + the data-parallel layout
constexpr uint32_t kStateMagicV3 = 0x74727333;  // "trs3": one process, no residuals
// The moments' formats: 0 fp32; 1 8-bit with v itself (refused); 2 8-bit with v's root in
// blocks of 2048 (refused); 5 the same in blocks of q8::kQuantBlock (256).
constexpr uint32_t kMoments8bitRoot2048 = 2;
constexpr uint32_t kMoments8bitRoot = 5;
constexpr uint32_t kLionMoment = 3;  // Lion's one fp32 moment
constexpr uint32_t kAdafactorState = 4;  // Adafactor's row and column means (a vector's own)
// What a state holds, in order (a kind the run does not have, none: residuals without a
// sparse sync).
constexpr Kind kStateKinds[] = {Kind::kParam, Kind::kAdamM, Kind::kAdamV, Kind::kResidual};

}  // namespace

namespace {
// 8-bit moments quantise in blocks: a ZeRO-2 slice holds whole blocks.
int64_t SliceAlign(const TrainOptions& options) { return options.moments_8bit ? q8::kQuantBlock : 1; }
}  // namespace

HomeShape HomeShapeFor(const ModelConfig& config, const TrainOptions& options) {
  HomeShape shape;
  shape.layout = ParamLayout(config);
  shape.saved = SavedLayout(config, options.batch, options.seq, options.checkpointing);
  shape.moments_8bit = options.moments_8bit;
  auto sync = GradSync::Create(options.dp, shape.layout, SliceAlign(options));
  if (sync.ok() && options.dp.sharded()) {
    shape.moments = shape.layout;
    for (size_t e = 0; e < shape.layout.size(); ++e) {
      const auto [lo, hi] = sync->Owned(e);
      // A tensor smaller than a slice's alignment leaves some ranks nothing: they keep a
      // one-element placeholder (no empty tensors to lease, copy or zero).
      shape.moments[e].count = std::max<size_t>(1, static_cast<size_t>(hi - lo));
    }
    if (options.dp.zero3) shape.params = shape.moments;  // the parameters' slices are the moments'
  }
  if (options.adafactor) {  // each tensor's state: rows + cols floats, or a vector's n
    shape.moments = shape.layout;
    for (TensorLayout& t : shape.moments) t.count = t.shape.size() == 2 ? t.shape[0] + t.shape[1] : t.count;
  }
  shape.residuals = sync.ok() && sync->sparse();
  shape.second_moment = !options.lion && !options.adafactor;
  return shape;
}

Trainer::Trainer(const ModelConfig& config, const TrainOptions& options, const Dataset& data, TensorHome& home)
    : config_(config),
      options_(options),
      shape_(HomeShapeFor(config, options)),
      data_(data),
      home_(home),
      model_(config, options.batch, options.seq, options.checkpointing) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config, const TrainOptions& options,
                                                        const Dataset& data, TensorHome& home) {
  if (options.dp.sparse_momentum && (options.lion || options.adafactor || options.moments_8bit)) {
    return absl::InvalidArgumentError(
        "--sparse_sync=momentum works on AdamW's fp32 moments (--opt=adamw): the TopK of the momentum over a frozen "
        "second moment");
  }
  if (options.adafactor && (options.dp.sharded() || options.lion || options.moments_8bit)) {
    return absl::InvalidArgumentError(
        "--opt=adafactor keeps each matrix's row and column means whole: not with --zero=2 or 3 (their slices cut "
        "matrices), nor with another optimizer's moments");
  }
  std::unique_ptr<Trainer> t(new Trainer(config, options, data, home));
  auto sync = GradSync::Create(options.dp, t->shape_.layout, SliceAlign(options));
  if (!sync.ok()) return sync.status();
  t->sync_ = std::move(*sync);
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return t;
}

absl::Status Trainer::Init() {
  model_.InitParams(options_.seed);
  // The model's own flat buffers are not where it computes here: its group hooks bind the
  // home's tensors. The gradients' go now, the parameters' once copied into the home.
  std::vector<float>().swap(model_.grads());
  size_t largest = 0;
  for (size_t e = 0; e < model_.layout().size(); ++e) {
    const TensorLayout& t = model_.layout()[e];
    largest = std::max(largest, t.count);
    Held held(home_, e);
    for (Kind k : {Kind::kParam, Kind::kGrad, Kind::kAdamM, Kind::kAdamV, Kind::kResidual}) {
      if (shape_.Of(k).empty()) continue;
      auto p = held.Get(k, Access::kOverwrite);
      if (!p.ok()) return p.status();
      if (k != Kind::kParam) {
        std::memset(*p, 0, TensorBytes(shape_.Of(k)[e], k, options_.moments_8bit));  // zero 8-bit moments too
      } else {  // the whole tensor, or with ZeRO-3 this rank's slice
        const auto [lo, hi] = options_.dp.zero3 ? sync_.Owned(e) : std::pair<int64_t, int64_t>(0, t.count);
        std::memcpy(*p, model_.params().data() + t.offset + lo, (hi - lo) * sizeof(float));
      }
    }
  }
  for (const TensorLayout& t : model_.saved_layout()) largest = std::max(largest, t.count);
  scratch_.assign(largest, 0.f);
  // ZeRO-3: a tensor is whole only while a forward or backward is inside its group (gathered_).
  std::vector<float>().swap(model_.params());
  gathered_.resize(options_.dp.zero3 ? model_.layout().size() : 0);
  batcher_seed_ = (options_.data_seed != 0 ? options_.data_seed : options_.seed) * 7919 + 1;
  batcher_ = std::make_unique<Batcher>(data_.train, options_.batch, options_.seq, batcher_seed_);
  // The model reaches its tensors group by group, only while it computes with them.
  model_.SetGroupHooks(
      [this](int group, bool backward) {
        Progress(GroupOp(micro_, group, backward));
        for (size_t e : model_.GroupEntries(group)) {
          auto p = home_.Acquire(e, Kind::kParam, Access::kRead);
          absl::StatusOr<float*> g = backward ? home_.Acquire(e, Kind::kGrad, Access::kWrite)
                                              : absl::StatusOr<float*>(nullptr);
          if ((!p.ok() || !g.ok()) && hook_error_.ok()) hook_error_ = !p.ok() ? p.status() : g.status();
          if (p.ok() && options_.dp.zero3) {  // every rank's slice into the whole tensor
            gathered_[e].resize(model_.layout()[e].count);
            if (absl::Status s = sync_.GatherFull(e, *p, gathered_[e].data()); !s.ok() && hook_error_.ok())
              hook_error_ = s;
            p = gathered_[e].data();
          }
          model_.Bind(e, p.ok() ? *p : scratch_.data(), g.ok() && *g != nullptr ? *g : scratch_.data());
        }
        // Forward writes the group's saved activations whole; backward reads them.
        if (const int saved = model_.SavedOf(group); saved >= 0) {
          auto a = home_.Acquire(saved, Kind::kSaved, backward ? Access::kRead : Access::kOverwrite);
          if (!a.ok() && hook_error_.ok()) hook_error_ = a.status();
          model_.BindSaved(saved, a.ok() ? *a : scratch_.data());
        }
      },
      [this](int group, bool backward) {
        for (size_t e : model_.GroupEntries(group)) {
          home_.Release(e, Kind::kParam).IgnoreError();
          if (backward) home_.Release(e, Kind::kGrad).IgnoreError();
          model_.Bind(e, nullptr, nullptr);
          if (options_.dp.zero3) std::vector<float>().swap(gathered_[e]);
        }
        if (const int saved = model_.SavedOf(group); saved >= 0) {
          home_.Release(saved, Kind::kSaved).IgnoreError();
          model_.BindSaved(saved, nullptr);
        }
      });
  // The planner moves tensors ahead of the ops; without it they move on demand.
  if (!options_.plan || options_.record_plan) return absl::OkStatus();
  auto planned = home_.RegisterGraph(StepGraph());
  plan_note_ = planned.ok() ? *planned : "no plan (" + std::string(planned.status().message()) + "): tensors move on demand";
  registered_ = planned.ok();
  return absl::OkStatus();
}

uint32_t Trainer::GroupOp(int micro, int group, bool backward) const {
  const int groups = config_.layers + 2;
  const size_t base = model_.layout().size() + static_cast<size_t>(micro) * 2 * groups;
  return static_cast<uint32_t>(base + (backward ? groups + (groups - 1 - group) : group));
}

uint32_t Trainer::ScaleOp(size_t entry) const {
  return static_cast<uint32_t>(model_.layout().size() + static_cast<size_t>(options_.grad_accum) * 2 *
                                                            (config_.layers + 2) + entry);
}

uint32_t Trainer::AdamOp(size_t entry) const { return ScaleOp(entry) + static_cast<uint32_t>(model_.layout().size()); }

void Trainer::Progress(uint32_t op) {
  // Progress only steers the moves: a lost message costs a demand fetch, not a value.
  if (in_step_ && registered_) home_.OpBegin(op).IgnoreError();
}

prefetcher::Graph Trainer::StepGraph() const {
  namespace tp = prefetcher;
  const auto& layout = model_.layout();
  const auto& saved = model_.saved_layout();
  tp::Graph g;
  g.host = true;  // this trainer computes on the CPU: its tensors are acquired in DRAM
  // The home's tensors, kind by kind (those a run has: no second moment for Lion, residuals
  // only with a sparse sync); tensor(e, kind) is one's index.
  std::array<size_t, kKinds> base{};
  for (Kind kind : {Kind::kParam, Kind::kGrad, Kind::kAdamM, Kind::kAdamV, Kind::kSaved, Kind::kResidual}) {
    base[static_cast<int>(kind)] = g.tensors.size();
    const auto& of = shape_.Of(kind);
    for (size_t e = 0; e < of.size(); ++e) {
      g.tensors.push_back(
          {TensorHome::Name(layout, saved, e, kind), TensorBytes(of[e], kind, options_.moments_8bit), false});
    }
  }
  auto tensor = [&](size_t entry, Kind kind) {
    return static_cast<tp::TensorIndex>(base[static_cast<int>(kind)] + entry);
  };
  const bool residuals = !shape_.Of(Kind::kResidual).empty();
  const double tokens = static_cast<double>(options_.batch) * options_.seq;
  auto stream = [](size_t floats) { return floats * 4.0 * 4 / 5e9; };  // a few passes at 5 GB/s
  for (size_t e = 0; e < layout.size(); ++e) {
    g.ops.push_back({"zero." + layout[e].name, {}, {}, stream(layout[e].count), {tensor(e, Kind::kGrad)}});
  }
  const int groups = config_.layers + 2;
  for (int micro = 0; micro < options_.grad_accum; ++micro) {
    for (int pass = 0; pass < 2; ++pass) {
      for (int k = 0; k < groups; ++k) {
        const bool backward = pass == 1;
        const int group = backward ? groups - 1 - k : k;
        tp::GraphOp op;
        op.name = absl::StrFormat("mb%d.group%d.%s", micro, group, backward ? "bwd" : "fwd");
        double params = 0;
        for (size_t e : model_.GroupEntries(group)) {
          op.reads.push_back(tensor(e, Kind::kParam));
          if (backward) op.writes.push_back(tensor(e, Kind::kGrad));
          params += layout[e].count;
        }
        if (const int s = model_.SavedOf(group); s >= 0) {
          (backward ? op.reads : op.overwrites).push_back(tensor(s, Kind::kSaved));
        }
        op.seconds = (backward ? 4 : 2) * tokens * params / 1e10;
        g.ops.push_back(std::move(op));
      }
    }
  }
  for (size_t e = 0; e < layout.size(); ++e) {
    tp::GraphOp op{"scale." + layout[e].name, {}, {tensor(e, Kind::kGrad)}, stream(layout[e].count)};
    if (residuals) op.writes.push_back(tensor(e, Kind::kResidual));
    g.ops.push_back(std::move(op));
  }
  for (size_t e = 0; e < layout.size(); ++e) {
    tp::GraphOp op{(options_.lion        ? "lion."
                    : options_.adafactor ? "adafactor."
                                         : "adamw.") +
                       layout[e].name,
                   {},
                   {tensor(e, Kind::kParam), tensor(e, Kind::kGrad), tensor(e, Kind::kAdamM)},
                   stream(4 * layout[e].count)};
    if (!shape_.Of(Kind::kAdamV).empty()) op.writes.push_back(tensor(e, Kind::kAdamV));
    g.ops.push_back(std::move(op));
  }
  return g;
}

absl::StatusOr<double> Trainer::ForwardBackward(const int32_t* inputs, const int32_t* targets, bool backward) {
  const double loss = model_.Forward(inputs, targets);
  if (backward && std::isfinite(loss) && hook_error_.ok()) model_.Backward();
  if (!hook_error_.ok()) return std::exchange(hook_error_, absl::OkStatus());
  return loss;
}

absl::StatusOr<StepResult> Trainer::Step() {
  StepResult r;
  r.step = step_ + 1;
  if (options_.record_plan) {
    // Recording only steers the moves: a refusal leaves the tensors moving on demand.
    auto note = home_.MarkIteration();
    if (!note.ok()) plan_note_ = "no recorded plan (" + std::string(note.status().message()) + "): tensors move on demand";
    else if (!note->empty()) plan_note_ = *note;
  }
  const auto& layout = model_.layout();
  in_step_ = true;
  struct StepEnd {
    bool& flag;
    ~StepEnd() { flag = false; }
  } step_end{in_step_};
  for (size_t e = 0; e < layout.size(); ++e) {  // gradients start from zero
    Progress(ZeroOp(e));
    Held held(home_, e);
    auto g = held.Get(Kind::kGrad, Access::kOverwrite);
    if (!g.ok()) return g.status();
    std::memset(*g, 0, layout[e].count * sizeof(float));
  }
  if (absl::Status s = MicroBatches(r); !s.ok()) return s;
  if (absl::Status s = AgreeOnLoss(r); !s.ok()) return s;
  r.lr = LearningRate(step_, options_.warmup, options_.steps, options_.lr, options_.min_lr);
  // The ranks agree on each gradient (this rank keeps its slice with ZeRO-2); every value
  // finite; the global norm. Every tensor is synced even after a non-finite one: the other
  // ranks are in the same collectives.
  const int sync_every = options_.dp.sync_every;
  const bool local = sync_every > 1;
  const bool update_mode = sync_.sparse() && options_.dp.sparse_update;
  sync_.BeginStep(step_ + 1);
  const bool momentum_phase = sync_.MomentumPhase();
  r.synced = !local;
  double sum_squares = 0, non_finite = 0;
  for (size_t e = 0; e < layout.size() && !r.skipped; ++e) {
    Progress(ScaleOp(e));
    Held held(home_, e);
    auto g = held.Get(Kind::kGrad, Access::kWrite);
    if (!g.ok()) return g.status();
    absl::StatusOr<float*> residual = nullptr;
    if (sync_.SparseK(e) > 0) residual = held.Get(Kind::kResidual, Access::kWrite);
    if (!residual.ok()) return residual.status();
    const bool own = local || ((update_mode || momentum_phase) && sync_.SparseK(e) > 0);  // this rank's only
    if (absl::Status s = sync_.Sync(e, *g, *residual, options_.grad_accum, own); !s.ok()) return s;
    const auto [lo, hi] = sync_.Owned(e);
    for (int64_t i = lo; i < hi; ++i) {
      const float x = (*g)[i];
      if (!std::isfinite(x)) {
        if (non_finite++ == 0)
          r.why = absl::StrFormat("the gradient of '%s' is %g at element %d", layout[e].name, x, i);
        break;
      }
      sum_squares += static_cast<double>(x) * x;
    }
  }
  // With ZeRO-2 and 3 each rank saw its slices only; with local steps its own gradients: the
  // ranks agree on skipping (and ZeRO-2 on the norm).
  if ((options_.dp.sharded() || local || update_mode || momentum_phase) && options_.dp.ranks() > 1 && !r.skipped) {
    double parts[2] = {options_.dp.sharded() ? sum_squares : 0.0, non_finite};
    if (absl::Status s = options_.dp.comm->AllReduce(parts, 2); !s.ok()) return s;
    if (options_.dp.sharded()) sum_squares = parts[0];
    if (non_finite == 0 && parts[1] > 0) r.why = "a gradient on another rank is not finite";
    non_finite = parts[1];
  }
  r.skipped = r.skipped || non_finite > 0;
  ++step_;
  if (r.skipped) return r;
  r.grad_norm = std::sqrt(sum_squares);
  const double clip = ClipFactor(r.grad_norm, options_.clip);
  for (size_t e = 0; e < layout.size(); ++e) {
    const TensorLayout& t = layout[e];
    Progress(AdamOp(e));
    Held held(home_, e);
    auto p = held.Get(Kind::kParam, Access::kWrite);
    auto g = p.ok() ? held.Get(Kind::kGrad, Access::kWrite) : p;
    auto m = g.ok() ? held.Get(Kind::kAdamM, Access::kWrite) : g;
    if (!m.ok()) return m.status();
    const auto [lo, hi] = sync_.Owned(e);
    // The parameters of the owned slice: at its offset in the whole tensor, or (ZeRO-3) the
    // slice is all this rank keeps.
    float* const owned = options_.dp.zero3 ? *p : *p + lo;
    const bool sparse_update = update_mode && sync_.SparseK(e) > 0;
    std::vector<float> before;
    if (sparse_update) before.assign(*p, *p + t.count);
    if (options_.adafactor) {  // the whole tensor (no ZeRO-2): its row and column means
      const bool matrix = t.shape.size() == 2;
      HostAdafactorParams ha;
      ha.lr = static_cast<float>(r.lr);
      ha.beta2t = static_cast<float>(1.0 - std::pow(static_cast<double>(step_), AdafactorOptions{}.decay_rate));
      ha.weight_decay = static_cast<float>(options_.adam.weight_decay);
      ha.grad_scale = static_cast<float>(clip);
      ha.decay = matrix;
      HostAdafactor(*p, *m, *g, matrix ? static_cast<int64_t>(t.shape[0]) : static_cast<int64_t>(t.count),
                    matrix ? static_cast<int64_t>(t.shape[1]) : 0, ha);
    } else if (momentum_phase && sync_.SparseK(e) > 0) {
      // This rank's momentum of its own gradient into the residual, the ranks' TopK of it
      // exchanged, applied over the second moment frozen at the end of the warm-up.
      auto v = held.Get(Kind::kAdamV, Access::kRead);
      auto residual = v.ok() ? held.Get(Kind::kResidual, Access::kWrite) : v;
      if (!residual.ok()) return residual.status();
      const float beta1 = static_cast<float>(options_.adam.beta1), scale = static_cast<float>(clip);
      float* u = *m;
      for (size_t i = 0; i < t.count; ++i) u[i] = beta1 * u[i] + (1.f - beta1) * ((*g)[i] * scale);
      std::vector<float>& mean = MomentumScratch(t.count);
      if (absl::Status s = sync_.SparseMomentum(e, u, *residual, mean.data()); !s.ok()) return s;
      const float lr = static_cast<float>(r.lr), eps = static_cast<float>(options_.adam.eps);
      const float c1 = 1.f - std::pow(beta1, static_cast<float>(step_));
      const float c2 = 1.f - std::pow(static_cast<float>(options_.adam.beta2), static_cast<float>(step_));
      const float decay = t.shape.size() > 1 ? lr * static_cast<float>(options_.adam.weight_decay) : 0.f;
      for (size_t i = 0; i < t.count; ++i) {
        (*p)[i] -= decay * (*p)[i];
        (*p)[i] -= lr * (mean[i] / c1) / (std::sqrt((*v)[i] / c2) + eps);
      }
    } else if (options_.lion) {  // with ZeRO-2 and 3 this rank's slice only; its moment holds that slice
      HostLionParams hl;
      hl.lr = static_cast<float>(r.lr);
      hl.beta1 = static_cast<float>(options_.lion_options.beta1);
      hl.beta2 = static_cast<float>(options_.lion_options.beta2);
      hl.weight_decay = static_cast<float>(options_.adam.weight_decay);
      hl.grad_scale = static_cast<float>(clip);
      hl.decay = t.shape.size() > 1;
      HostLion(owned, *m, *g + lo, hi - lo, hl);
    } else {
      auto v = held.Get(Kind::kAdamV, Access::kWrite);
      if (!v.ok()) return v.status();
      // On the DRAM tier where the state lives: vectorised, on the host's threads, fp32 as on
      // the GPU (the double-precision AdamWStep stays the tests' reference). With ZeRO-2 and 3
      // this rank's slice only; its moments hold that slice.
      HostAdamWParams hp;
      hp.lr = static_cast<float>(r.lr);
      hp.beta1 = static_cast<float>(options_.adam.beta1);
      hp.beta2 = static_cast<float>(options_.adam.beta2);
      hp.eps = static_cast<float>(options_.adam.eps);
      hp.weight_decay = static_cast<float>(options_.adam.weight_decay);
      hp.step = step_;
      hp.grad_scale = static_cast<float>(clip);
      hp.decay = t.shape.size() > 1;
      if (options_.moments_8bit) {
        HostAdamW8bit(owned, *m, *v, /*weights_bf16=*/nullptr, *g + lo, hi - lo, hp);
      } else {
        HostAdamW(owned, *m, *v, /*weights_bf16=*/nullptr, *g + lo, hi - lo, hp);
      }
    }
    if (sparse_update) {
      auto residual = held.Get(Kind::kResidual, Access::kWrite);
      if (!residual.ok()) return residual.status();
      if (absl::Status s = sync_.SparseUpdate(e, *p, before.data(), *residual); !s.ok()) return s;
    }
    if (absl::Status s = sync_.GatherParams(e, *p); !s.ok()) return s;
    if (local && step_ % sync_every == 0) {  // local steps: the ranks' parameters averaged
      if (absl::Status s = sync_.AverageParams(e, *p); !s.ok()) return s;
      r.synced = true;
    }
  }
  return r;
}

absl::Status Trainer::MicroBatches(StepResult& r) {
  // Rank k of N takes micro-batches k*A .. k*A+A-1 of the N*A the step draws: the order one
  // process with N*A micro-batches would take them in.
  const int ranks = options_.dp.ranks(), rank = options_.dp.rank(), micros = options_.grad_accum;
  if (ranks > 1) batcher_->Skip(static_cast<int64_t>(rank) * micros);
  const int n = options_.batch * options_.seq;
  std::vector<int32_t> inputs(n), targets(n);
  int drawn = 0;
  for (int micro = 0; micro < micros; ++micro) {
    micro_ = micro;
    batcher_->Next(inputs.data(), targets.data());
    ++drawn;
    auto loss = ForwardBackward(inputs.data(), targets.data(), /*backward=*/true);
    if (!loss.ok()) return loss.status();
    r.loss += *loss / micros;
    if (!std::isfinite(*loss)) {
      r.skipped = true;
      r.why = absl::StrFormat("the loss of micro-batch %d is %g", micro, *loss);
      break;
    }
  }
  if (ranks > 1) {  // every rank ends the step at the same place in the data
    batcher_->Skip(static_cast<int64_t>(micros - drawn) + static_cast<int64_t>(ranks - 1 - rank) * micros);
    drawn = ranks * micros;
  }
  batches_drawn_ += drawn;
  return absl::OkStatus();
}

absl::Status Trainer::AgreeOnLoss(StepResult& r) {
  if (options_.dp.ranks() == 1) return absl::OkStatus();
  double parts[2] = {r.loss, r.skipped ? 1.0 : 0.0};
  if (absl::Status s = options_.dp.comm->AllReduce(parts, 2); !s.ok()) return s;
  r.loss = parts[0] / options_.dp.ranks();
  if (!r.skipped && parts[1] > 0) {
    r.skipped = true;
    r.why = "a micro-batch's loss on another rank is not finite";
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::ValidationLoss(int batches) {
  Batcher val(data_.val, options_.batch, options_.seq, /*seed=*/12345);
  const int n = options_.batch * options_.seq;
  std::vector<int32_t> inputs(n), targets(n);
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    val.Next(inputs.data(), targets.data());
    auto loss = ForwardBackward(inputs.data(), targets.data(), /*backward=*/false);
    if (!loss.ok()) return loss.status();
    total += *loss;
  }
  return total / batches;
}

uint32_t Trainer::MomentsFormat() const {
  return options_.lion           ? kLionMoment
         : options_.adafactor    ? kAdafactorState
         : options_.moments_8bit ? kMoments8bitRoot
                                 : 0u;
}

// The sync's part of a state's header: 1 ZeRO-2, 4 ZeRO-3; 2 sparse, with 8 in update mode and
// 16 in momentum mode (a rank's own moments, which another mode would take for the shared ones).
uint32_t Trainer::DpFlags() const {
  const bool sparse = sync_.sparse();
  return (options_.dp.zero2 ? 1u : 0u) | (sparse ? 2u : 0u) | (options_.dp.zero3 ? 4u : 0u) |
         (sparse && options_.dp.sparse_update ? 8u : 0u) | (sparse && options_.dp.sparse_momentum ? 16u : 0u);
}

namespace {
std::string DescribeDpFlags(uint32_t flags) {
  return std::string(flags & 1   ? ", ZeRO-2"
                     : flags & 4 ? ", ZeRO-3"
                                 : "") +
         (flags & 16  ? ", sparse sync of momenta"
          : flags & 8 ? ", sparse sync of updates"
          : flags & 2 ? ", sparse sync of gradients"
                      : "");
}
}  // namespace

absl::StatusOr<std::string> Trainer::SaveState() {
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  uint64_t count = 0;
  for (const TensorLayout& t : model_.layout()) count += t.count;
  put(&kStateMagic, 4);
  put(&step_, 8);
  put(&batches_drawn_, 8);
  put(&count, 8);
  const uint32_t format = MomentsFormat();
  put(&format, 4);
  const uint32_t dp[3] = {static_cast<uint32_t>(options_.dp.ranks()), static_cast<uint32_t>(options_.dp.rank()),
                          DpFlags()};
  put(dp, sizeof(dp));
  for (Kind k : kStateKinds) {
    for (size_t e = 0; e < shape_.Of(k).size(); ++e) {
      Held held(home_, e);
      auto p = held.Get(k, Access::kRead);
      if (!p.ok()) return p.status();
      put(*p, TensorBytes(shape_.Of(k)[e], k, options_.moments_8bit));
    }
  }
  return out;
}

absl::Status Trainer::LoadState(const std::string& bytes) {
  size_t at = 0;
  auto take = [&](void* p, size_t n) {
    if (at + n > bytes.size()) return false;
    std::memcpy(p, bytes.data() + at, n);
    at += n;
    return true;
  };
  uint32_t magic = 0;
  int64_t step = 0, drawn = 0;
  uint64_t count = 0, expected = 0, state_bytes = 0;
  uint32_t format = 0;
  for (const TensorLayout& t : model_.layout()) expected += t.count;
  for (Kind k : kStateKinds) {
    for (const TensorLayout& t : shape_.Of(k)) state_bytes += TensorBytes(t, k, options_.moments_8bit);
  }
  if (!take(&magic, 4) || (magic != kStateMagic && magic != kStateMagicV3)) {
    return absl::InvalidArgumentError("not a trainer state (bad magic)");
  }
  if (!take(&step, 8) || !take(&drawn, 8) || !take(&count, 8) || !take(&format, 4)) {
    return absl::InvalidArgumentError("trainer state truncated in its header");
  }
  uint32_t dp[3] = {1, 0, 0};  // a state of the first format: one process
  if (magic == kStateMagic && !take(dp, sizeof(dp))) return absl::InvalidArgumentError("trainer state truncated");
  if (dp[0] != static_cast<uint32_t>(options_.dp.ranks()) || dp[1] != static_cast<uint32_t>(options_.dp.rank()) ||
      dp[2] != DpFlags()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state is rank %d of %d%s; this run is rank %d of %d%s: resume with the ranks and sync it was saved "
        "with",
        dp[1], dp[0], DescribeDpFlags(dp[2]), options_.dp.rank(), options_.dp.ranks(), DescribeDpFlags(DpFlags())));
  }
  if (count != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state holds %d parameters; model '%s' has %d (another --model_size?)", count, config_.name, expected));
  }
  if (format == 1 || format == kMoments8bitRoot2048) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state's 8-bit moments are of an earlier 8-bit format (%s; this build quantizes in blocks of %d): this "
        "trainer cannot continue it; start afresh or use the build that wrote it",
        format == 1 ? "the second moment itself, not its root" : "blocks of 2048", q8::kQuantBlock));
  }
  if (format != MomentsFormat()) {
    auto name = [](uint32_t f) {
      return f == kLionMoment        ? "Lion's"
             : f == kAdafactorState  ? "Adafactor's"
             : f == kMoments8bitRoot ? "8-bit"
                                     : "fp32";
    };
    return absl::InvalidArgumentError(
        absl::StrFormat("the state's moments are %s; this run's are %s (--opt)", name(format), name(MomentsFormat())));
  }
  if (bytes.size() != at + state_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("trainer state of %d bytes; %d expected", bytes.size(), at + state_bytes));
  }
  for (Kind k : kStateKinds) {
    for (size_t e = 0; e < shape_.Of(k).size(); ++e) {
      Held held(home_, e);
      auto p = held.Get(k, Access::kOverwrite);
      if (!p.ok()) return p.status();
      take(*p, TensorBytes(shape_.Of(k)[e], k, options_.moments_8bit));
    }
  }
  step_ = step;
  // The data order continues where it was.
  batcher_ = std::make_unique<Batcher>(data_.train, options_.batch, options_.seq, batcher_seed_);
  batcher_->Skip(drawn);
  batches_drawn_ = drawn;
  return absl::OkStatus();
}

}  // namespace tierd::trainer
