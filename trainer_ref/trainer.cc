#include "trainer_ref/trainer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adamw.h"

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

constexpr uint32_t kStateMagic = 0x74727333;  // "trs3": + the moments' format
// The moments' formats: 0 fp32; 1 8-bit with v itself (refused); 2 8-bit with v's root.
constexpr uint32_t kMoments8bitRoot = 2;

}  // namespace

Trainer::Trainer(const ModelConfig& config, const TrainOptions& options, const Dataset& data, TensorHome& home)
    : config_(config), options_(options), data_(data), home_(home), model_(config, options.batch, options.seq, options.checkpointing) {}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const ModelConfig& config, const TrainOptions& options,
                                                        const Dataset& data, TensorHome& home) {
  std::unique_ptr<Trainer> t(new Trainer(config, options, data, home));
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return t;
}

absl::Status Trainer::Init() {
  model_.InitParams(options_.seed);
  size_t largest = 0;
  for (size_t e = 0; e < model_.layout().size(); ++e) {
    const TensorLayout& t = model_.layout()[e];
    largest = std::max(largest, t.count);
    Held held(home_, e);
    for (Kind k : {Kind::kParam, Kind::kGrad, Kind::kAdamM, Kind::kAdamV}) {
      auto p = held.Get(k, Access::kOverwrite);
      if (!p.ok()) return p.status();
      if (k == Kind::kParam) std::memcpy(*p, model_.params().data() + t.offset, t.count * sizeof(float));
      else std::memset(*p, 0, TensorBytes(t, k, options_.moments_8bit));  // zero bytes: zero 8-bit moments too
    }
  }
  for (const TensorLayout& t : model_.saved_layout()) largest = std::max(largest, t.count);
  scratch_.assign(largest, 0.f);
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
  auto tensor = [&](size_t entry, Kind kind) {
    return static_cast<tp::TensorIndex>(kind == Kind::kSaved ? 4 * layout.size() + entry
                                                             : static_cast<size_t>(kind) * layout.size() + entry);
  };
  for (Kind kind : {Kind::kParam, Kind::kGrad, Kind::kAdamM, Kind::kAdamV}) {
    for (size_t e = 0; e < layout.size(); ++e) {
      g.tensors.push_back(
          {TensorHome::Name(layout, saved, e, kind), TensorBytes(layout[e], kind, options_.moments_8bit), false});
    }
  }
  for (size_t s = 0; s < saved.size(); ++s) {
    g.tensors.push_back({TensorHome::Name(layout, saved, s, Kind::kSaved), saved[s].count * sizeof(float), false});
  }
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
    g.ops.push_back({"scale." + layout[e].name, {}, {tensor(e, Kind::kGrad)}, stream(layout[e].count)});
  }
  for (size_t e = 0; e < layout.size(); ++e) {
    g.ops.push_back({"adamw." + layout[e].name,
                     {},
                     {tensor(e, Kind::kParam), tensor(e, Kind::kGrad), tensor(e, Kind::kAdamM), tensor(e, Kind::kAdamV)},
                     stream(4 * layout[e].count)});
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
  const int n = options_.batch * options_.seq;
  std::vector<int32_t> inputs(n), targets(n);
  for (int micro = 0; micro < options_.grad_accum; ++micro) {
    micro_ = micro;
    batcher_->Next(inputs.data(), targets.data());
    ++batches_drawn_;
    auto loss = ForwardBackward(inputs.data(), targets.data(), /*backward=*/true);
    if (!loss.ok()) return loss.status();
    r.loss += *loss / options_.grad_accum;
    if (!std::isfinite(*loss)) {
      r.skipped = true;
      r.why = absl::StrFormat("the loss of micro-batch %d is %g", micro, *loss);
      break;
    }
  }
  r.lr = LearningRate(step_, options_.warmup, options_.steps, options_.lr, options_.min_lr);
  // The mean over micro-batches; every value finite; the global norm.
  double sum_squares = 0;
  for (size_t e = 0; e < layout.size() && !r.skipped; ++e) {
    Progress(ScaleOp(e));
    Held held(home_, e);
    auto g = held.Get(Kind::kGrad, Access::kWrite);
    if (!g.ok()) return g.status();
    for (size_t i = 0; i < layout[e].count; ++i) {
      float& x = (*g)[i];
      x /= options_.grad_accum;
      if (!std::isfinite(x)) {
        r.skipped = true;
        r.why = absl::StrFormat("the gradient of '%s' is %g at element %d", layout[e].name, x, i);
        break;
      }
      sum_squares += static_cast<double>(x) * x;
    }
  }
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
    auto v = m.ok() ? held.Get(Kind::kAdamV, Access::kWrite) : m;
    if (!v.ok()) return v.status();
    // On the DRAM tier where the state lives: vectorised, on the host's threads, fp32 as on
    // the GPU (the double-precision AdamWStep stays the tests' reference).
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
      HostAdamW8bit(*p, *m, *v, /*weights_bf16=*/nullptr, *g, static_cast<int64_t>(t.count), hp);
    } else {
      HostAdamW(*p, *m, *v, /*weights_bf16=*/nullptr, *g, static_cast<int64_t>(t.count), hp);
    }
  }
  return r;
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

absl::StatusOr<std::string> Trainer::SaveState() {
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  uint64_t count = 0;
  for (const TensorLayout& t : model_.layout()) count += t.count;
  put(&kStateMagic, 4);
  put(&step_, 8);
  put(&batches_drawn_, 8);
  put(&count, 8);
  const uint32_t format = options_.moments_8bit ? kMoments8bitRoot : 0;
  put(&format, 4);
  for (Kind k : {Kind::kParam, Kind::kAdamM, Kind::kAdamV}) {
    for (size_t e = 0; e < model_.layout().size(); ++e) {
      Held held(home_, e);
      auto p = held.Get(k, Access::kRead);
      if (!p.ok()) return p.status();
      put(*p, TensorBytes(model_.layout()[e], k, options_.moments_8bit));
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
  for (const TensorLayout& t : model_.layout()) {
    expected += t.count;
    for (Kind k : {Kind::kParam, Kind::kAdamM, Kind::kAdamV}) state_bytes += TensorBytes(t, k, options_.moments_8bit);
  }
  if (!take(&magic, 4) || magic != kStateMagic) return absl::InvalidArgumentError("not a trainer state (bad magic)");
  if (!take(&step, 8) || !take(&drawn, 8) || !take(&count, 8) || !take(&format, 4)) {
    return absl::InvalidArgumentError("trainer state truncated in its header");
  }
  if (count != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state holds %d parameters; model '%s' has %d (another --model_size?)", count, config_.name, expected));
  }
  if (format == 1) {
    return absl::InvalidArgumentError(
        "the state's 8-bit moments are of the first 8-bit format (the second moment itself, not its root): this "
        "trainer cannot continue it; start afresh or use the build that wrote it");
  }
  if (format != (options_.moments_8bit ? kMoments8bitRoot : 0u)) {
    return absl::InvalidArgumentError(absl::StrFormat("the state's moments are %s; this run's are %s (--opt)",
                                                      format ? "8-bit" : "fp32",
                                                      options_.moments_8bit ? "8-bit" : "fp32"));
  }
  if (bytes.size() != at + state_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("trainer state of %d bytes; %d expected", bytes.size(), at + state_bytes));
  }
  for (Kind k : {Kind::kParam, Kind::kAdamM, Kind::kAdamV}) {
    for (size_t e = 0; e < model_.layout().size(); ++e) {
      Held held(home_, e);
      auto p = held.Get(k, Access::kOverwrite);
      if (!p.ok()) return p.status();
      take(*p, TensorBytes(model_.layout()[e], k, options_.moments_8bit));
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
