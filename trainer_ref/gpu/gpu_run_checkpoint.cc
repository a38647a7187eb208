#include "trainer_ref/gpu/gpu_run_checkpoint.h"

#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"
#include "trainer_ref/checkpoint.h"

namespace tierd::trainer::gpu {
namespace {

std::string EncodeRun(const RunState& r) {
  std::string out = absl::StrFormat("step=%d batches=%d losses=%d;", r.step, r.batches_drawn, r.losses.size());
  out.append(reinterpret_cast<const char*>(r.losses.data()), r.losses.size() * sizeof(double));
  return out;
}

absl::StatusOr<RunState> DecodeRun(const std::string& bytes) {
  RunState r;
  long long step = 0, drawn = 0;
  size_t count = 0;
  int used = 0;
  if (std::sscanf(bytes.c_str(), "step=%lld batches=%lld losses=%zu;%n", &step, &drawn, &count, &used) != 3 ||
      used <= 0 || bytes.size() != static_cast<size_t>(used) + count * sizeof(double)) {
    return absl::DataLossError("the checkpoint's run record is malformed");
  }
  r.step = step;
  r.batches_drawn = drawn;
  r.losses.resize(count);
  std::memcpy(r.losses.data(), bytes.data() + used, count * sizeof(double));
  return r;
}

}  // namespace

absl::StatusOr<std::string> SaveCheckpoint(GpuModel& model, const RunState& run, const RunSettings& s) {
  auto writer = CheckpointWriter::Create(s.checkpoint_dir, run.step);
  if (!writer.ok()) return writer.status();
  const std::string encoded = EncodeRun(run);
  if (absl::Status st = (*writer)->Append("run", encoded.data(), encoded.size()); !st.ok()) return st;
  if (absl::Status st = model.SaveState(**writer); !st.ok()) return st;
  auto path = (*writer)->Commit();
  if (path.ok()) PruneCheckpoints(s.checkpoint_dir, s.checkpoint_keep);
  return path;
}

absl::StatusOr<RunState> Resume(GpuModel& model, const RunSettings& s, CheckpointTrail& ck) {
  auto reader = OpenNewestCheckpoint(s.checkpoint_dir);
  if (!reader.ok()) return reader.status();
  auto encoded = (*reader)->ReadString("run");
  if (!encoded.ok()) return encoded.status();
  auto run = DecodeRun(*encoded);
  if (!run.ok()) return run.status();
  if (absl::Status st = model.LoadState(**reader); !st.ok()) return st;
  ck.last_path = (*reader)->path();
  ck.last_step = run->step;
  return run;
}

}  // namespace tierd::trainer::gpu
