// The C interface (tierd_client.h) over tierd::Client.
#include <map>
#include <memory>
#include <string>

#include "clients/client.h"
#include "clients/tierd_client.h"

struct tierd_client {
  std::unique_ptr<tierd::Client> client;
  std::map<uint64_t, tierd::Client::Tensor> tensors;
  std::string last_error;
};

namespace {

int Report(tierd_client* c, const absl::Status& status) {
  c->last_error = status.ok() ? "" : std::string(status.message());
  return static_cast<int>(status.code());
}

absl::StatusOr<tierd::Client::Tensor> Known(tierd_client* c, uint64_t id) {
  auto it = c->tensors.find(id);
  if (it == c->tensors.end()) return absl::NotFoundError("no tensor " + std::to_string(id) + " leased by this client");
  return it->second;
}

}  // namespace

extern "C" {

int tierd_connect(const char* runtime_dir, const char* label, uint64_t gpu_bytes, uint64_t dram_bytes,
                  uint64_t nvme_bytes, tierd_client** out) {
  if (out == nullptr) return static_cast<int>(absl::StatusCode::kInvalidArgument);
  auto* c = new tierd_client();
  *out = c;
  auto client = tierd::Client::Connect({runtime_dir ? runtime_dir : "/tmp/tierd", label ? label : "c-client",
                                        {gpu_bytes, dram_bytes, nvme_bytes}});
  if (!client.ok()) return Report(c, client.status());
  c->client = std::move(*client);
  return Report(c, absl::OkStatus());
}

int tierd_lease(tierd_client* c, const char* name, int tensor_class, int dtype, const int64_t* shape, int rank,
                uint64_t* tensor, uint64_t* bytes) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  if (name == nullptr || shape == nullptr || rank <= 0 || tensor == nullptr || tensor_class < 0 ||
      tensor_class > TIERD_CLASS_SCRATCH || dtype < 0 || dtype > TIERD_DTYPE_U8) {
    return Report(c, absl::InvalidArgumentError("tierd_lease: null name/shape/tensor, rank <= 0, or an unknown class or dtype"));
  }
  tierd::TensorSpec spec{name, static_cast<tierd::TensorClass>(tensor_class), static_cast<tierd::DType>(dtype),
                         std::vector<int64_t>(shape, shape + rank)};
  auto leased = c->client->Lease(spec);
  if (!leased.ok()) return Report(c, leased.status());
  c->tensors[leased->id] = *leased;
  *tensor = leased->id;
  if (bytes != nullptr) *bytes = leased->bytes;
  return Report(c, absl::OkStatus());
}

int tierd_unlease(tierd_client* c, uint64_t tensor) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  auto known = Known(c, tensor);
  if (!known.ok()) return Report(c, known.status());
  absl::Status status = c->client->Unlease(*known);
  if (status.ok()) c->tensors.erase(tensor);
  return Report(c, status);
}

int tierd_acquire(tierd_client* c, uint64_t tensor, int access, int place, void** pointer) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  auto known = Known(c, tensor);
  if (!known.ok()) return Report(c, known.status());
  if (pointer == nullptr || (access < TIERD_ACCESS_READ || access > TIERD_ACCESS_OVERWRITE) ||
      (place != TIERD_PLACE_GPU && place != TIERD_PLACE_HOST)) {
    return Report(c, absl::InvalidArgumentError("tierd_acquire: null pointer, or access/place out of range"));
  }
  auto p = c->client->Acquire(*known, static_cast<tierd::Access>(access),
                              place == TIERD_PLACE_GPU ? tierd::Place::kGpu : tierd::Place::kHost);
  if (!p.ok()) return Report(c, p.status());
  *pointer = *p;
  return Report(c, absl::OkStatus());
}

int tierd_release(tierd_client* c, uint64_t tensor) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  auto known = Known(c, tensor);
  if (!known.ok()) return Report(c, known.status());
  return Report(c, c->client->Release(*known));
}

int tierd_pin(tierd_client* c, uint64_t tensor, int tier) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  auto known = Known(c, tensor);
  if (!known.ok()) return Report(c, known.status());
  if (tier < TIERD_TIER_GPU || tier > TIERD_TIER_NVME) return Report(c, absl::InvalidArgumentError("tierd_pin: unknown tier"));
  return Report(c, c->client->Pin(*known, static_cast<tierd::Tier>(tier)));
}

int tierd_unpin(tierd_client* c, uint64_t tensor) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  auto known = Known(c, tensor);
  if (!known.ok()) return Report(c, known.status());
  return Report(c, c->client->Unpin(*known));
}

int tierd_report_step(tierd_client* c, int64_t step, double loss, double seconds, double tokens) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  return Report(c, c->client->ReportStep(step, loss, seconds, tokens));
}

int tierd_mark_iteration(tierd_client* c) {
  if (c == nullptr || !c->client) return static_cast<int>(absl::StatusCode::kFailedPrecondition);
  return Report(c, c->client->MarkIteration().status());
}

const char* tierd_last_error(const tierd_client* c) { return c == nullptr ? "no client" : c->last_error.c_str(); }

void tierd_close(tierd_client* c) { delete c; }

}  // extern "C"
