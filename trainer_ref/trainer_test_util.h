// What the trainer's tests share: small options and plain buffers for a trainer's tensors.
#ifndef TIERD_TRAINER_REF_TRAINER_TEST_UTIL_H_
#define TIERD_TRAINER_REF_TRAINER_TEST_UTIL_H_

#include <memory>

#include "trainer_ref/trainer.h"

namespace tierd::trainer {

inline TrainOptions Small() {
  TrainOptions o;
  o.batch = 4;
  o.seq = 32;
  o.steps = 60;
  o.warmup = 5;
  o.seed = 3;
  return o;
}

// Plain buffers for every tensor a trainer with these options leases.
inline std::unique_ptr<Home> PlainHomeFor(const ModelConfig& config, const TrainOptions& o) {
  return MakePlainHome(HomeShapeFor(config, o).Table()).value();
}

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TRAINER_TEST_UTIL_H_
