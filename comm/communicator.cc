#include "comm/communicator.h"

#include <algorithm>
#include <cstring>

namespace tierd::comm {

Slices Slices::Even(int64_t total, int ranks, int64_t align) {
  Slices s;
  align = std::max<int64_t>(1, align);
  const int64_t blocks = (total + align - 1) / align;
  const int64_t per = (blocks + ranks - 1) / ranks;  // blocks a rank, the last ones fewer
  for (int r = 0; r < ranks; ++r) {
    const int64_t begin = std::min(total, r * per * align);
    const int64_t end = std::min(total, (r + 1) * per * align);
    s.offset.push_back(begin);
    s.count.push_back(end - begin);
  }
  return s;
}

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  absl::Status AllReduce(float*, int64_t, ReduceOp) override { return absl::OkStatus(); }
  absl::Status AllReduce(double*, int64_t, ReduceOp) override { return absl::OkStatus(); }
  absl::Status ReduceScatterSum(float*, const Slices&) override { return absl::OkStatus(); }
  absl::Status AllGather(float*, const Slices&) override { return absl::OkStatus(); }
  absl::Status AllGatherBytes(const void* in, void* out, int64_t bytes) override {
    if (in != out) std::memmove(out, in, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

}  // namespace

std::unique_ptr<Communicator> MakeLocalCommunicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace tierd::comm
