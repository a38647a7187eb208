#include "trainer_ref/trainer.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/trainer_internal.h"

namespace tierd::trainer {

namespace {
// 8-bit moments quantise in blocks: a ZeRO-2 slice holds whole blocks.
int64_t SliceAlign(const TrainOptions& options) { return options.moments_8bit ? q8::kQuantBlock : 1; }
}  // namespace

absl::Status Trainer::ReadParam(size_t entry, float* out) {
  if (options_.dp.zero3) {
    return absl::FailedPreconditionError("with ZeRO-3 each rank holds a slice of each parameter: no export");
  }
  Held held(home_, entry);
  auto p = held.Get(Kind::kParam, Access::kRead);
  if (!p.ok()) return p.status();
  std::memcpy(out, *p, model_.layout()[entry].count * sizeof(float));
  return absl::OkStatus();
}

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

Trainer::Trainer(const ModelConfig& config, const TrainOptions& options, const Dataset& data, TensorHome home)
    : config_(config),
      options_(options),
      shape_(HomeShapeFor(config, options)),
      data_(data),
      home_(home),
      model_(config, options.batch, options.seq, options.checkpointing) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config, const TrainOptions& options,
                                                        const Dataset& data, Home& home) {
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
  auto view = TensorHome::Over(HomeShapeFor(config, options), home);
  if (!view.ok()) return view.status();
  std::unique_ptr<Trainer> t(new Trainer(config, options, data, *view));
  auto sync = GradSync::Create(options.dp, t->shape_.layout, SliceAlign(options));
  if (!sync.ok()) return sync.status();
  t->sync_ = std::move(*sync);
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return t;
}

absl::Status Trainer::Init() {
  model_.InitParams(options_.seed);
  if (options_.init_params) {
    if (absl::Status s = options_.init_params(&model_.params()); !s.ok()) return s;
  }
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
  batcher_ = std::make_unique<Batcher>(data_.train, options_.batch, options_.seq, batcher_seed_, &data_.train_mask);
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
  auto planned = home_.home().RegisterGraph(StepGraph());
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
  if (in_step_ && registered_) home_.home().OpBegin(op).IgnoreError();
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

absl::StatusOr<double> Trainer::ValidationLoss(int batches) {
  Batcher val(data_.val, options_.batch, options_.seq, kValidationSeed, &data_.val_mask);
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

}  // namespace tierd::trainer
