// Run under mpirun (comm/mpi_test.sh): every collective of MpiCommunicator on data that
// depends on the rank, against the values it must give; sizes that do not divide evenly,
// empty slices, and the traffic counted. Prints "rank R: N passed, M failed".
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "comm/mpi_communicator.h"

namespace tc = tierd::comm;

namespace {

int passed = 0, failed = 0;

void Expect(bool ok, int rank, const char* what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("rank %d: FAIL %s\n", rank, what);
  }
}

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + i % 977) * 0.25f; }

}  // namespace

int main() {
  auto made = tc::MakeMpiCommunicator({.timeout_seconds = 60});
  if (!made.ok()) {
    std::printf("FAIL: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  tc::Communicator& c = **made;
  const int r = c.rank(), n = c.size();
  // All-reduce: sums of small integers times 0.25 are exact in float, whatever the order.
  for (int64_t count : {1, 1000, 100003}) {
    std::vector<float> x(count);
    for (int64_t i = 0; i < count; ++i) x[i] = Value(r, i);
    Expect(c.AllReduce(x.data(), count).ok(), r, "all-reduce returned an error");
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int k = 0; k < n; ++k) want += Value(k, i);
      ok = ok && x[i] == want;
    }
    Expect(ok, r, "all-reduce sums");
  }
  double d[2] = {static_cast<double>(r), -static_cast<double>(r)};
  Expect(c.AllReduce(d, 2, tc::ReduceOp::kMax).ok() && d[0] == n - 1 && d[1] == 0, r, "all-reduce max");
  double m = 10.0 + r;
  Expect(c.AllReduce(&m, 1, tc::ReduceOp::kMin).ok() && m == 10.0, r, "all-reduce min");
  // Reduce-scatter then all-gather: ZeRO's pair. 10007 elements in blocks of 64: uneven.
  for (int64_t total : {int64_t{10007}, int64_t{5}}) {
    const tc::Slices s = tc::Slices::Even(total, n, 64);
    std::vector<float> x(total);
    for (int64_t i = 0; i < total; ++i) x[i] = Value(r, i);
    Expect(c.ReduceScatterSum(x.data(), s).ok(), r, "reduce-scatter returned an error");
    bool ok = true;
    for (int64_t i = s.offset[r]; i < s.offset[r] + s.count[r]; ++i) {
      float want = 0;
      for (int k = 0; k < n; ++k) want += Value(k, i);
      ok = ok && x[i] == want;
    }
    Expect(ok, r, "reduce-scatter: this rank's slice holds the sums");
    // Each rank writes its slice as rank-tagged values, then gathers everyone's.
    for (int64_t i = s.offset[r]; i < s.offset[r] + s.count[r]; ++i) x[i] = static_cast<float>(r * 100000 + i);
    Expect(c.AllGather(x.data(), s).ok(), r, "all-gather returned an error");
    ok = true;
    for (int k = 0; k < n; ++k) {
      for (int64_t i = s.offset[k]; i < s.offset[k] + s.count[k]; ++i) ok = ok && x[i] == k * 100000 + i;
    }
    Expect(ok, r, "all-gather: every slice from its rank");
  }
  std::vector<int32_t> mine = {r, r * 7, -r}, all(3 * n);
  Expect(c.AllGatherBytes(mine.data(), all.data(), sizeof(int32_t) * 3).ok(), r, "byte gather returned an error");
  bool ok = true;
  for (int k = 0; k < n; ++k) ok = ok && all[3 * k] == k && all[3 * k + 1] == 7 * k && all[3 * k + 2] == -k;
  Expect(ok, r, "byte gather: every rank's block in rank order");
  Expect(c.Barrier().ok(), r, "barrier");
  // Traffic: 11 calls; bytes on the wire only with more than one rank.
  Expect(c.stats().calls == 11 && (c.stats().bytes_sent > 0) == (n > 1), r, "traffic counted for every call");
  std::printf("rank %d of %d: %d passed, %d failed\n", r, n, passed, failed);
  return failed == 0 ? 0 : 1;
}
