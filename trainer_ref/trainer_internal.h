// What the trainer's files share: the scoped acquire of an entry's tensors.
#ifndef TIERD_TRAINER_REF_TRAINER_INTERNAL_H_
#define TIERD_TRAINER_REF_TRAINER_INTERNAL_H_

#include <vector>

#include "trainer_ref/tensor_home.h"

namespace tierd::trainer {

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

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TRAINER_INTERNAL_H_
