// A trainer-like client process for the multi-process tests: it connects to tierd with a
// small quota, leases tensors, writes them through the pointers it gets, makes tierd
// evict and fetch them back, and checks every byte.
//   client_worker RUNTIME_DIR roundtrip SEED   exit 0 when every byte came back right
//   client_worker RUNTIME_DIR hold             lease + acquire, print "ready", sleep forever
//   client_worker RUNTIME_DIR planned[-hold|-host-optimizer] LAPS   a planned training loop
#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "clients/graph_spec.h"
#include "prefetcher/synthetic.h"
#include "proto/tierd.grpc.pb.h"

namespace tierd {
namespace {

void Fill(void* p, uint64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* out = static_cast<uint8_t*>(p);
  for (uint64_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(rng());
}

bool Same(const void* p, uint64_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  const auto* in = static_cast<const uint8_t*>(p);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (in[i] != static_cast<uint8_t>(rng())) return false;
  }
  return true;
}

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "client_worker: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

int Roundtrip(const std::string& dir, uint32_t seed) {
  // 2 MiB of GPU, 2 MiB of DRAM, 16 MiB of NVMe for six 1 MiB tensors.
  auto client = Client::Connect({dir, "worker-" + std::to_string(seed), {2 * kMiB, 2 * kMiB, 16 * kMiB}});
  if (!client.ok()) return Fail("connect", client.status());
  std::vector<Client::Tensor> tensors;
  for (int i = 0; i < 6; ++i) {
    auto t = (*client)->Lease({"layers." + std::to_string(i), TensorClass::kParam, DType::kBF16, {512, 1024}});
    if (!t.ok()) return Fail("lease", t.status());
    tensors.push_back(*t);
  }
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Place place = (i + round) % 2 ? Place::kGpu : Place::kHost;
      auto p = (*client)->Acquire(tensors[i], Access::kWrite, place);
      if (!p.ok()) return Fail("acquire for write", p.status());
      Fill(*p, tensors[i].bytes, seed * 100 + i + round);
      if (auto s = (*client)->Release(tensors[i]); !s.ok()) return Fail("release", s);
    }
    for (size_t i = tensors.size(); i-- > 0;) {
      const Place place = (i + round) % 3 ? Place::kGpu : Place::kHost;
      auto p = (*client)->Acquire(tensors[i], Access::kRead, place);
      if (!p.ok()) return Fail("acquire for read", p.status());
      if (!Same(*p, tensors[i].bytes, seed * 100 + i + round)) {
        std::fprintf(stderr, "client_worker: tensor %zu came back wrong (round %d)\n", i, round);
        return 1;
      }
      if (auto s = (*client)->Release(tensors[i]); !s.ok()) return Fail("release", s);
    }
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) return Fail("stats", stats.status());
  std::printf("ok: stalls %lu, writebacks %lu\n", static_cast<unsigned long>(stats->stalls()),
              static_cast<unsigned long>(stats->writebacks()));
  return 0;
}

// A small training loop under a plan: registers the iteration graph of a synthetic
// 8-layer model, runs `laps` iterations reporting each op, checks every value it reads,
// prints the plan's summary, and (hold) waits to be killed so tierctl can look. With
// `host_optimizer` the optimizer ops run on the host (acquired in DRAM, like a GPU
// trainer's CPU AdamW).
int Planned(const std::string& dir, int laps, bool hold, bool host_optimizer = false) {
  prefetcher::TraceOptions trace;
  trace.optimizer_on_host = host_optimizer;
  trace.micro_batch_seqs = 1;
  trace.seq_len = 64;
  trace.grad_accum = 2;
  trace.flops_per_s = 1e10;
  const prefetcher::Graph graph = prefetcher::SyntheticTransformer({"sim", 8, 128, 344, 256}, trace);
  uint64_t total = 0;
  for (const auto& t : graph.tensors) total += t.bytes;
  auto client = Client::Connect({dir, "planned", {total * 45 / 100, total / 2, 2 * total}});
  if (!client.ok()) return Fail("connect", client.status());
  std::vector<Client::Tensor> tensors;
  std::vector<uint32_t> version(graph.tensors.size(), 0);
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    const auto& g = graph.tensors[t];
    auto lease = (*client)->Lease({g.name, TensorClass::kParam, DType::kU8, {static_cast<int64_t>(g.bytes)}});
    if (!lease.ok()) return Fail("lease", lease.status());
    tensors.push_back(*lease);
    auto p = (*client)->Acquire(*lease, Access::kOverwrite, Place::kHost);
    if (!p.ok()) return Fail("first write", p.status());
    Fill(*p, g.bytes, static_cast<uint32_t>(t * 1000));
    if (auto s = (*client)->Release(*lease); !s.ok()) return Fail("release", s);
  }
  auto plan = (*client)->RegisterGraph(ToGraphSpec(graph));
  if (!plan.ok()) return Fail("register graph", plan.status());
  uint64_t misses = 0;
  for (int lap = 0; lap < laps; ++lap) {
    for (uint32_t i = 0; i < graph.ops.size(); ++i) {
      if (auto s = (*client)->OpBegin(i); !s.ok()) return Fail("op begin", s);
      const auto& op = graph.ops[i];
      std::vector<std::pair<prefetcher::TensorIndex, Place>> uses;
      for (auto t : prefetcher::Touched(op)) uses.push_back({t, Place::kGpu});
      for (auto t : prefetcher::HostTouched(op)) uses.push_back({t, Place::kHost});
      for (auto [t, place] : uses) {
        const auto use = place == Place::kGpu ? prefetcher::UseOf(op, t) : prefetcher::HostUseOf(op, t);
        const Access access = use == prefetcher::Use::kRead ? Access::kRead
                              : use == prefetcher::Use::kWrite ? Access::kWrite : Access::kOverwrite;
        auto p = (*client)->Acquire(tensors[t], access, place);
        if (!p.ok()) return Fail("acquire " + graph.tensors[t].name + " at " + op.name, p.status());
        if (use != prefetcher::Use::kOverwrite && !Same(*p, tensors[t].bytes, t * 1000 + version[t])) {
          std::fprintf(stderr, "client_worker: %s came back wrong at %s (lap %d)\n", graph.tensors[t].name.c_str(),
                       op.name.c_str(), lap);
          return 1;
        }
        if (use != prefetcher::Use::kRead) Fill(*p, tensors[t].bytes, static_cast<uint32_t>(t * 1000 + ++version[t]));
        if (auto s = (*client)->Release(tensors[t]); !s.ok()) return Fail("release", s);
      }
    }
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) return Fail("stats", stats.status());
  misses = stats->stalls();
  std::printf("ok planned: %d laps, prefetches %lu, discards %lu, hits %lu, stalls %lu\n%s", laps,
              static_cast<unsigned long>(stats->prefetches()), static_cast<unsigned long>(stats->discards()),
              static_cast<unsigned long>(stats->acquire_hits()), static_cast<unsigned long>(misses),
              plan->summary().c_str());
  if (hold) {
    std::printf("ready %lu\n", static_cast<unsigned long>((*client)->session_id()));
    std::fflush(stdout);
    for (;;) pause();
  }
  return 0;
}

int Hold(const std::string& dir) {
  auto client = Client::Connect({dir, "holder", {1 * kMiB, 1 * kMiB, 0}});
  if (!client.ok()) return Fail("connect", client.status());
  auto t = (*client)->Lease({"held", TensorClass::kActivation, DType::kF32, {1024}});
  if (!t.ok()) return Fail("lease", t.status());
  auto p = (*client)->Acquire(*t, Access::kWrite, Place::kGpu);
  if (!p.ok()) return Fail("acquire", p.status());
  std::printf("ready %lu\n", static_cast<unsigned long>((*client)->session_id()));
  std::fflush(stdout);
  for (;;) pause();
}

// Acquires and releases one tensor in a loop until a call fails (tierd gone): says "churning"
// once, then the error, and exits 1.
int Churn(const std::string& dir) {
  auto client = Client::Connect({dir, "churner", {1 * kMiB, 1 * kMiB, 0}});
  if (!client.ok()) return Fail("connect", client.status());
  auto t = (*client)->Lease({"churned", TensorClass::kActivation, DType::kF32, {1024}});
  if (!t.ok()) return Fail("lease", t.status());
  for (int round = 0;; ++round) {
    auto p = (*client)->Acquire(*t, Access::kWrite, round % 2 ? Place::kGpu : Place::kHost);
    if (!p.ok()) return Fail("acquire", p.status());
    if (auto s = (*client)->Release(*t); !s.ok()) return Fail("release", s);
    if (round == 100) {
      std::printf("churning\n");
      std::fflush(stdout);
    }
  }
}

// Tries what an administrator does, straight over tierd's gRPC socket (no hello: refused),
// then as an observer (a hello: refused unless this uid is allowed). Prints one line per try,
// "admin: <call>: <status>", and exits 0.
int Admin(const std::string& dir) {
  auto stub =
      v1::Tierd::NewStub(grpc::CreateChannel("unix:" + dir + "/tierd.grpc.sock", grpc::InsecureChannelCredentials()));
  v1::Empty empty;
  v1::ConfigReply config;
  grpc::ClientContext c1;
  const grpc::Status got_config = stub->GetConfig(&c1, empty, &config);
  std::printf("admin: GetConfig without a hello: %s\n", got_config.ok() ? "OK" : got_config.error_message().c_str());
  v1::ListLeasesRequest every;
  v1::ListLeasesReply leases;
  grpc::ClientContext c2;
  const grpc::Status listed = stub->ListLeases(&c2, every, &leases);
  std::printf("admin: ListLeases without a hello: %s\n", listed.ok() ? "OK" : listed.error_message().c_str());
  v1::AdminPinRequest pin;
  pin.set_session_id(1);
  pin.set_name("secret.w");
  pin.set_tier(v1::TIER_NVME);
  v1::Empty none;
  grpc::ClientContext c3;
  const grpc::Status pinned = stub->AdminPin(&c3, pin, &none);
  std::printf("admin: AdminPin without a hello: %s\n", pinned.ok() ? "OK" : pinned.error_message().c_str());
  ClientOptions observer;
  observer.runtime_dir = dir;
  observer.label = "admin";
  observer.use_ring = false;
  observer.observer = true;
  auto session = Client::Connect(observer);
  std::printf("admin: observer hello: %s\n", session.ok() ? "OK" : std::string(session.status().message()).c_str());
  if (session.ok()) {
    auto all = (*session)->ListLeases(/*every_session=*/true);
    std::printf("admin: ListLeases as an observer: %s\n",
                all.ok() ? absl::StrFormat("OK, %d leases", all->leases_size()).c_str()
                         : std::string(all.status().message()).c_str());
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  // "admin-as UID": the administration calls as another user.
  if (argc >= 4 && std::strcmp(argv[2], "admin-as") == 0) {
    const unsigned id = std::stoul(argv[3]);
    if (setgroups(0, nullptr) != 0 || setgid(id) != 0 || setuid(id) != 0) {
      std::perror("client_worker: dropping privileges");
      return 3;
    }
    return tierd::Admin(argv[1]);
  }
  if (argc >= 3 && std::strcmp(argv[2], "admin") == 0) return tierd::Admin(argv[1]);
  // "roundtrip-as UID SEED": drop to UID (and its gid = UID) first, like another user.
  if (argc >= 5 && std::strcmp(argv[2], "roundtrip-as") == 0) {
    const unsigned id = std::stoul(argv[3]);
    if (setgroups(0, nullptr) != 0 || setgid(id) != 0 || setuid(id) != 0) {
      std::perror("client_worker: dropping privileges");
      return 3;
    }
    return tierd::Roundtrip(argv[1], static_cast<uint32_t>(std::stoul(argv[4])));
  }
  if (argc >= 4 && std::strcmp(argv[2], "roundtrip") == 0) {
    return tierd::Roundtrip(argv[1], static_cast<uint32_t>(std::stoul(argv[3])));
  }
  if (argc >= 3 && std::strcmp(argv[2], "hold") == 0) return tierd::Hold(argv[1]);
  if (argc >= 3 && std::strcmp(argv[2], "churn") == 0) return tierd::Churn(argv[1]);
  if (argc >= 4 && std::strcmp(argv[2], "planned") == 0) return tierd::Planned(argv[1], std::stoi(argv[3]), false);
  if (argc >= 4 && std::strcmp(argv[2], "planned-host-optimizer") == 0) {
    return tierd::Planned(argv[1], std::stoi(argv[3]), false, /*host_optimizer=*/true);
  }
  if (argc >= 4 && std::strcmp(argv[2], "planned-hold") == 0) {
    return tierd::Planned(argv[1], std::stoi(argv[3]), true);
  }
  std::fprintf(stderr, "usage: client_worker RUNTIME_DIR (roundtrip SEED | hold)\n");
  return 2;
}
