// Trainer::Step: the micro-batches' forward and backward, the ranks' agreement on each
// gradient, and each tensor's optimizer update.
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adafactor.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/host_lion.h"
#include "trainer_ref/trainer.h"
#include "trainer_ref/trainer_internal.h"

namespace tierd::trainer {

absl::StatusOr<StepResult> Trainer::Step() {
  StepResult r;
  r.step = step_ + 1;
  if (options_.record_plan) {
    // Recording only steers the moves: a refusal leaves the tensors moving on demand.
    auto note = home_.home().MarkIteration();
    if (!note.ok())
      plan_note_ = "no recorded plan (" + std::string(note.status().message()) + "): tensors move on demand";
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
  const bool local = options_.dp.sync_every > 1;
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
  const SyncModes modes{local, update_mode, momentum_phase};
  for (size_t e = 0; e < layout.size(); ++e) {
    if (absl::Status s = UpdateTensor(e, clip, modes, r); !s.ok()) return s;
  }
  return r;
}

HostAdamWParams Trainer::AdamParams(double lr, double clip, const TensorLayout& t) const {
  HostAdamWParams hp;
  hp.lr = static_cast<float>(lr);
  hp.beta1 = static_cast<float>(options_.adam.beta1);
  hp.beta2 = static_cast<float>(options_.adam.beta2);
  hp.eps = static_cast<float>(options_.adam.eps);
  hp.weight_decay = static_cast<float>(options_.adam.weight_decay);
  hp.step = step_;
  hp.grad_scale = static_cast<float>(clip);
  hp.decay = t.shape.size() > 1;
  return hp;
}

absl::Status Trainer::UpdateTensor(size_t e, double clip, const SyncModes& modes, StepResult& r) {
  const TensorLayout& t = model_.layout()[e];
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
  const bool sparse_update = modes.update && sync_.SparseK(e) > 0;
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
  } else if (modes.momentum && sync_.SparseK(e) > 0) {
    // This rank's momentum of its own gradient into the residual, the ranks' TopK of it
    // exchanged, applied over the second moment frozen at the end of the warm-up.
    auto v = held.Get(Kind::kAdamV, Access::kRead);
    auto residual = v.ok() ? held.Get(Kind::kResidual, Access::kWrite) : v;
    if (!residual.ok()) return residual.status();
    const HostAdamWParams hp = AdamParams(r.lr, clip, t);
    HostMomentum(*m, *g, static_cast<int64_t>(t.count), hp);
    std::vector<float>& mean = MomentumScratch(t.count);
    if (absl::Status s = sync_.SparseMomentum(e, *m, *residual, mean.data()); !s.ok()) return s;
    HostAdamWFromMoments(*p, mean.data(), *v, static_cast<int64_t>(t.count), hp);
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
    const HostAdamWParams hp = AdamParams(r.lr, clip, t);
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
  if (modes.local && step_ % options_.dp.sync_every == 0) {  // local steps: the ranks' parameters averaged
    if (absl::Status s = sync_.AverageParams(e, *p); !s.ok()) return s;
    r.synced = true;
  }
  return absl::OkStatus();
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

}  // namespace tierd::trainer
