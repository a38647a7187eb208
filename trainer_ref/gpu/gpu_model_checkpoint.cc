// The GPU model's state to and from a checkpoint, group by group, wherever the home keeps
// it: with a host tier (tierd's DRAM) the bytes go between the file and DRAM directly; on
// plain GPU buffers through a pinned staging buffer. Nothing else is held at once, so a
// state far larger than host memory streams through.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/adamw8bit_block.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_internal.h"

namespace tierd::trainer::gpu {
namespace {

constexpr Part kSavedParts[] = {Part::kWeights, Part::kMaster, Part::kAdamM, Part::kAdamV};
constexpr uint64_t kStagingBytes = 64 * kMiB;

// Pinned host memory for device copies, freed on scope exit.
struct Staging {
  void* bytes = nullptr;
  ~Staging() {
    if (bytes != nullptr) cudaFreeHost(bytes);
  }
};

}  // namespace

std::string GpuModel::ShapeRecord() const {
  // The moments' format and the compact state (no weights records) are part of the shape:
  // their records differ in bytes and meaning.
  return absl::StrFormat(
      "layers=%d d_model=%d heads=%d d_ff=%d vocab=%d norm_eps=%.9g rope_theta=%.9g params=%d%s%s%s%s",
      config_.layers, config_.d_model, config_.heads, config_.d_ff, config_.vocab, config_.norm_eps,
      config_.rope_theta, total_params_, FamilyRecord(config_),
      optimizer_->MomentsRecord(), compact_ ? " state=compact" : "", optimizer_->OptimizerRecord());
}

// fn(host pointer to bytes [at, at + n) of the chunk, n) over the chunk in pieces; the piece is
// in the home's DRAM tier, or in `staging` (copied from the GPU first when `to_host`; copied
// to the GPU after fn when not).
absl::Status GpuModel::ForEachPiece(int g, Part part, int chunk, bool to_host, void* staging,
                                    const std::function<absl::Status(void*, uint64_t, uint64_t)>& fn) {
  const uint64_t bytes = home_layout_.Chunk(g, part, chunk).bytes;
  const Access access = to_host ? Access::kRead : Access::kOverwrite;
  if (home_->HasHostTier()) {
    auto host = home_->AcquireHost(g, part, chunk, access);
    if (!host.ok()) return AcquireError(host.status(), g, part, chunk, " on the host for the checkpoint");
    const absl::Status s = fn(*host, 0, bytes);
    const absl::Status released = home_->ReleaseHost(g, part, chunk);
    return s.ok() ? released : s;
  }
  RETURN_IF_ERROR(Enter(g, part, access, chunk));
  auto* device = static_cast<unsigned char*>(acquired_[g][static_cast<int>(part)]);
  absl::Status s;
  for (uint64_t at = 0; at < bytes && s.ok(); at += kStagingBytes) {
    const uint64_t n = std::min(kStagingBytes, bytes - at);
    if (to_host) {
      s = Cuda(cudaMemcpyAsync(staging, device + at, n, cudaMemcpyDeviceToHost, stream_), "checkpoint download");
      if (s.ok()) s = Cuda(cudaStreamSynchronize(stream_), "checkpoint download");
      if (s.ok()) s = fn(staging, at, n);
    } else {
      s = fn(staging, at, n);
      if (s.ok())
        s = Cuda(cudaMemcpyAsync(device + at, staging, n, cudaMemcpyHostToDevice, stream_), "checkpoint upload");
      if (s.ok()) s = Cuda(cudaStreamSynchronize(stream_), "checkpoint upload");  // staging is reused
    }
  }
  const absl::Status left = Leave(g, part);
  return s.ok() ? left : s;
}

absl::Status GpuModel::SaveState(CheckpointWriter& writer) {
  RETURN_IF_ERROR(FinishOptimizerStep());  // the host's step in flight writes the state
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "checkpoint"));
  const std::string shape = ShapeRecord();
  RETURN_IF_ERROR(writer.Append("model", shape.data(), shape.size()));
  Staging staging;
  if (!home_->HasHostTier()) RETURN_IF_ERROR(Cuda(cudaMallocHost(&staging.bytes, kStagingBytes), "staging buffer"));
  for (int g = 0; g < Groups(); ++g) {
    for (Part part : kSavedParts) {
      if (home_layout_.bytes[g][static_cast<int>(part)] == 0) continue;  // the compact state's weights
      RETURN_IF_ERROR(
          writer.BeginRecord(PartName(home_layout_, g, part), home_layout_.bytes[g][static_cast<int>(part)]));
      if (part == Part::kWeights && WeightsAreScratch(g)) {  // the plan dropped them: from the master copy
        RETURN_IF_ERROR(WeightsFromMasterOnHost(
            g, [&](const Bf16* bf16, size_t n) { return writer.Write(bf16, n * sizeof(Bf16)); }));
        RETURN_IF_ERROR(writer.EndRecord());
        continue;
      }
      for (int c = 0; c < home_layout_.Chunks(g, part); ++c) {
        RETURN_IF_ERROR(ForEachPiece(g, part, c, /*to_host=*/true, staging.bytes,
                                     [&](void* p, uint64_t, uint64_t n) { return writer.Write(p, n); }));
      }
      RETURN_IF_ERROR(writer.EndRecord());
    }
  }
  if (fp8_ != nullptr) {  // which layers are FP8 now, and every tensor's scaling state
    std::string record = "layers=";
    for (bool on : fp8_layer_) record += on ? '1' : '0';
    record += ';';
    auto state = fp8_->SaveState(stream_);
    if (!state.ok()) return state.status();
    record += *state;
    RETURN_IF_ERROR(writer.Append("fp8", record.data(), record.size()));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::LoadFp8State(CheckpointReader& reader) {
  auto next = reader.Peek();
  // A checkpoint of a bf16 run, or of one before FP8 scaling was saved: the scales start afresh.
  if (!next.ok() || next->first != "fp8") return absl::OkStatus();
  auto record = reader.ReadString("fp8");
  if (!record.ok()) return record.status();
  const size_t end = record->find(';');
  if (record->rfind("layers=", 0) != 0 || end != 7 + fp8_layer_.size() || record->find_first_not_of("01", 7) != end) {
    return absl::DataLossError(absl::StrFormat(
        "checkpoint '%s': the FP8 record's layers are malformed (%d layers here)", reader.path(), fp8_layer_.size()));
  }
  RETURN_IF_ERROR(fp8_->RestoreState(record->substr(end + 1), stream_));
  // Layers that fell back stay bf16; --bf16_layers may have added more since.
  for (size_t l = 0; l < fp8_layer_.size(); ++l) fp8_layer_[l] = fp8_layer_[l] && (*record)[7 + l] == '1';
  return absl::OkStatus();
}

absl::Status GpuModel::LoadState(CheckpointReader& reader) {
  RETURN_IF_ERROR(FinishOptimizerStep());
  auto shape = reader.ReadString("model");
  if (!shape.ok()) return shape.status();
  if (*shape != ShapeRecord()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint '%s' is of another model shape (%s) than this one (%s)", reader.path(), *shape, ShapeRecord()));
  }
  Staging staging;
  if (!home_->HasHostTier()) RETURN_IF_ERROR(Cuda(cudaMallocHost(&staging.bytes, kStagingBytes), "staging buffer"));
  weights_group_ = -1;  // the compact state's weights are the master copy's, read anew
  for (int g = 0; g < Groups(); ++g) {
    for (Part part : kSavedParts) {
      if (home_layout_.bytes[g][static_cast<int>(part)] == 0) continue;
      RETURN_IF_ERROR(
          reader.BeginRecord(PartName(home_layout_, g, part), home_layout_.bytes[g][static_cast<int>(part)]));
      for (int c = 0; c < home_layout_.Chunks(g, part); ++c) {
        const uint64_t chunk_at = home_layout_.Chunk(g, part, c).offset;
        RETURN_IF_ERROR(ForEachPiece(g, part, c, /*to_host=*/false, staging.bytes,
                                     [&](void* p, uint64_t at, uint64_t n) -> absl::Status {
                                       RETURN_IF_ERROR(reader.ReadPiece(p, n));
                                       if (part != Part::kMaster) return absl::OkStatus();
                                       return RefreshNorms(g, chunk_at + at, p, n);
                                     }));
      }
      RETURN_IF_ERROR(reader.EndRecord());
    }
    grads_zeroed_[g] = false;
  }
  if (fp8_ != nullptr) RETURN_IF_ERROR(LoadFp8State(reader));
  return Cuda(cudaStreamSynchronize(stream_), "checkpoint load");
}

// The resident fp32 norm weights from master bytes [at, at + n) of group g at host `p`.
absl::Status GpuModel::RefreshNorms(int g, uint64_t at, const void* p, uint64_t n) {
  for (size_t e : GroupEntries(g)) {
    if (layout_[e].shape.size() != 1) continue;
    const uint64_t lo = (layout_[e].offset - group_offset_[g]) * sizeof(float);
    const uint64_t hi = lo + layout_[e].count * sizeof(float);
    const uint64_t from = std::max(lo, at), to = std::min(hi, at + n);
    if (from >= to) continue;
    RETURN_IF_ERROR(
        Cuda(cudaMemcpy(reinterpret_cast<unsigned char*>(N(e)) + (from - lo),
                        static_cast<const unsigned char*>(p) + (from - at), to - from, cudaMemcpyHostToDevice),
             "norm weights from the checkpoint"));
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
