#include "trainer_ref/trainer.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tierd::trainer {

Trainer::Trainer(const ModelConfig& config, const TrainOptions& options, const Dataset& data)
    : config_(config), options_(options), data_(data), model_(config, options.batch, options.seq) {
  model_.InitParams(options.seed);
  m_.assign(model_.params().size(), 0.f);
  v_.assign(model_.params().size(), 0.f);
  decay_.assign(model_.params().size(), true);
  for (const TensorLayout& t : model_.layout()) {
    if (t.shape.size() == 1) std::fill(decay_.begin() + t.offset, decay_.begin() + t.offset + t.count, false);
  }
  batcher_seed_ = options.seed * 7919 + 1;
  batcher_ = std::make_unique<Batcher>(data_.train, options.batch, options.seq, batcher_seed_);
}

StepResult Trainer::Step() {
  StepResult r;
  r.step = step_ + 1;
  const int n = options_.batch * options_.seq;
  std::vector<int32_t> inputs(n), targets(n);
  model_.ZeroGrads();
  for (int micro = 0; micro < options_.grad_accum; ++micro) {
    batcher_->Next(inputs.data(), targets.data());
    ++batches_drawn_;
    const float loss = model_.Forward(inputs.data(), targets.data());
    r.loss += loss / options_.grad_accum;
    if (!std::isfinite(loss)) {
      r.skipped = true;
      r.why = absl::StrFormat("the loss of micro-batch %d is %g", micro, loss);
      break;
    }
    model_.Backward();
  }
  std::vector<float>& g = model_.grads();
  if (!r.skipped) {
    for (float& x : g) x /= options_.grad_accum;  // the mean over micro-batches
    for (const TensorLayout& t : model_.layout()) {
      for (size_t i = 0; i < t.count; ++i) {
        if (!std::isfinite(g[t.offset + i])) {
          r.skipped = true;
          r.why = absl::StrFormat("the gradient of '%s' is %g at element %d", t.name, g[t.offset + i], i);
          break;
        }
      }
      if (r.skipped) break;
    }
  }
  r.lr = LearningRate(step_, options_.warmup, options_.steps, options_.lr, options_.min_lr);
  if (r.skipped) {
    ++step_;
    return r;
  }
  r.grad_norm = GlobalNorm(g.data(), g.size());
  const double clip = ClipFactor(r.grad_norm, options_.clip);
  if (clip < 1.0) {
    for (float& x : g) x = static_cast<float>(x * clip);
  }
  ++step_;
  std::vector<float>& p = model_.params();
  for (const TensorLayout& t : model_.layout()) {
    AdamWStep(p.data() + t.offset, g.data() + t.offset, m_.data() + t.offset, v_.data() + t.offset, t.count, r.lr,
              step_, options_.adam, decay_[t.offset]);
  }
  return r;
}

double Trainer::ValidationLoss(int batches) {
  Batcher val(data_.val, options_.batch, options_.seq, /*seed=*/12345);
  const int n = options_.batch * options_.seq;
  std::vector<int32_t> inputs(n), targets(n);
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    val.Next(inputs.data(), targets.data());
    total += model_.Forward(inputs.data(), targets.data());
  }
  return total / batches;
}

namespace {
constexpr uint32_t kStateMagic = 0x74727331;  // "trs1"

void Put(std::string& out, const void* p, size_t n) { out.append(static_cast<const char*>(p), n); }
bool Take(const std::string& in, size_t& at, void* p, size_t n) {
  if (at + n > in.size()) return false;
  std::memcpy(p, in.data() + at, n);
  at += n;
  return true;
}
}  // namespace

std::string Trainer::SaveState() const {
  std::string out;
  const uint64_t count = model_.params().size();
  Put(out, &kStateMagic, 4);
  Put(out, &step_, 8);
  Put(out, &batches_drawn_, 8);
  Put(out, &count, 8);
  for (const std::vector<float>* v : {&model_.params(), &m_, &v_}) Put(out, v->data(), count * 4);
  return out;
}

absl::Status Trainer::LoadState(const std::string& bytes) {
  size_t at = 0;
  uint32_t magic = 0;
  int64_t step = 0, drawn = 0;
  uint64_t count = 0;
  if (!Take(bytes, at, &magic, 4) || magic != kStateMagic) {
    return absl::InvalidArgumentError("not a trainer state (bad magic)");
  }
  if (!Take(bytes, at, &step, 8) || !Take(bytes, at, &drawn, 8) || !Take(bytes, at, &count, 8)) {
    return absl::InvalidArgumentError("trainer state truncated in its header");
  }
  if (count != model_.params().size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state holds %d parameters; model '%s' has %d (another --model-size?)", count, config_.name,
        model_.params().size()));
  }
  if (bytes.size() != at + 3 * count * 4) {
    return absl::InvalidArgumentError(absl::StrFormat("trainer state of %d bytes; %d expected", bytes.size(),
                                                      at + 3 * count * 4));
  }
  for (std::vector<float>* v : {&model_.params(), &m_, &v_}) Take(bytes, at, v->data(), count * 4);
  step_ = step;
  // Replay the data order to where it was (draws are cheap next to steps).
  batcher_ = std::make_unique<Batcher>(data_.train, options_.batch, options_.seq, batcher_seed_);
  const int n = options_.batch * options_.seq;
  std::vector<int32_t> inputs(n), targets(n);
  for (int64_t i = 0; i < drawn; ++i) batcher_->Next(inputs.data(), targets.data());
  batches_drawn_ = drawn;
  return absl::OkStatus();
}

}  // namespace tierd::trainer
