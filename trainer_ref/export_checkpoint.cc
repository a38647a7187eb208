#include "trainer_ref/export_checkpoint.h"

#include <sys/stat.h>

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/model.h"
#include "trainer_ref/trainer_state_format.h"

namespace tierd::trainer {
namespace {

// A group of the GPU trainer's checkpoint (ParamGroups): its master record holds the
// parameters [first, first + count) of ParamLayout's flat order.
struct Group {
  std::string name;
  size_t first_entry = 0;
  uint64_t first = 0, count = 0;
};

std::vector<Group> GroupsOf(const ModelConfig& config) {
  const std::vector<TensorLayout> layout = ParamLayout(config);
  std::vector<Group> groups;
  for (const ParamGroup& g : ParamGroups(config)) {
    Group out{g.name, g.entries.front(), layout[g.entries.front()].offset, 0};
    for (size_t e : g.entries) out.count += layout[e].count;
    groups.push_back(out);
  }
  return groups;
}

absl::Status Skip(CheckpointReader& reader, const std::string& name, uint64_t bytes) {
  if (absl::Status s = reader.BeginRecord(name, bytes); !s.ok()) return s;
  std::vector<char> scratch(std::min<uint64_t>(bytes, uint64_t{64} << 20));
  for (uint64_t left = bytes; left > 0;) {
    const uint64_t n = std::min<uint64_t>(left, scratch.size());
    if (absl::Status s = reader.ReadPiece(scratch.data(), n); !s.ok()) return s;
    left -= n;
  }
  return reader.EndRecord();
}

absl::StatusOr<std::string> PickCheckpoint(const std::string& checkpoint) {
  struct stat st {};
  if (::stat(checkpoint.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("--checkpoint '%s' does not exist", checkpoint));
  }
  if (!S_ISDIR(st.st_mode)) return checkpoint;
  std::string skipped;
  auto latest = LatestCheckpoint(checkpoint, &skipped);
  if (latest.ok() && !skipped.empty()) std::printf("export: %s\n", skipped.c_str());
  return latest;
}

}  // namespace

absl::StatusOr<std::vector<float>> ParamsOfTrainerState(const std::string& state, uint64_t count) {
  auto h = ReadTrainerStateHeader(state);
  if (!h.ok()) return h.status();
  if ((h->dp[2] & kStateZero3) != 0 && h->dp[0] > 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a ZeRO-3 rank's state (rank %d of %d) holds a slice of each parameter; export from a dense or ZeRO-2 run",
        h->dp[1], h->dp[0]));
  }
  if (h->count != count) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the state holds %d parameters; this model has %d (other model flags?)", h->count, count));
  }
  if (h->bytes + count * sizeof(float) > state.size()) {
    return absl::InvalidArgumentError("the trainer state is cut short");
  }
  std::vector<float> params(count);
  std::memcpy(params.data(), state.data() + h->bytes, count * sizeof(float));
  return params;
}

absl::Status ExportTrainerCheckpoint(const ModelConfig& config, const std::string& checkpoint, const std::string& to,
                                     const hf::ExportOptions& options) {
  if (absl::Status s = hf::CheckExportDir(to); !s.ok()) return s;
  auto path = PickCheckpoint(checkpoint);
  if (!path.ok()) return path.status();
  auto reader = CheckpointReader::Open(*path);
  if (!reader.ok()) return reader.status();
  auto first = (*reader)->Peek();
  if (!first.ok()) return first.status();
  if (first->first == "run") {  // the GPU trainer's: the run's state, then the model's records
    if (absl::Status s = Skip(**reader, first->first, first->second); !s.ok()) return s;
    first = (*reader)->Peek();
    if (!first.ok()) return first.status();
  }
  const std::vector<TensorLayout> layout = ParamLayout(config);
  const uint64_t count = layout.back().offset + layout.back().count;
  if (first->first == "state") {  // the CPU trainer's: one record
    auto state = (*reader)->ReadString("state");
    if (!state.ok()) return state.status();
    auto params = ParamsOfTrainerState(*state, count);
    if (!params.ok()) return absl::Status(params.status().code(), *path + ": " + std::string(params.status().message()));
    return hf::ExportHfCheckpoint(
        config, to,
        [&](size_t e, float* out) {
          std::memcpy(out, params->data() + layout[e].offset, layout[e].count * sizeof(float));
          return absl::OkStatus();
        },
        options);
  }
  if (first->first != "model") {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is no trainer checkpoint tierd-train wrote", *path));
  }
  auto shape = (*reader)->ReadString("model");
  if (!shape.ok()) return shape.status();
  const std::string want = absl::StrFormat("layers=%d d_model=%d heads=%d d_ff=%d vocab=%d ", config.layers,
                                           config.d_model, config.heads, config.d_ff, config.vocab);
  const std::string family = FamilyRecord(config);
  if (!absl::StartsWith(*shape, want) || (!family.empty() && shape->find(family) == std::string::npos) ||
      shape->find(absl::StrFormat(" params=%d", count)) == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is a checkpoint of a model with %s; the flags give %s%sparams=%d: give the run's model flags (or "
        "--init_from)",
        *path, *shape, want, family.empty() ? "" : family.substr(1) + " ", count));
  }
  // A group's master record at a time, in the order the export asks for them (layout order).
  const std::vector<Group> groups = GroupsOf(config);
  size_t next_group = 0;
  std::vector<float> values;
  int held = -1;
  auto read = [&](size_t e, float* out) -> absl::Status {
    size_t g = 0;
    while (g + 1 < groups.size() && groups[g + 1].first_entry <= e) ++g;
    while (held != static_cast<int>(g)) {
      auto next = (*reader)->Peek();
      if (!next.ok()) return next.status();
      const std::string master = "master." + groups[next_group].name;
      if (next->first != master && next->first != master + ".0") {
        if (absl::Status s = Skip(**reader, next->first, next->second); !s.ok()) return s;
        continue;
      }
      if (next->second != groups[next_group].count * sizeof(float)) {
        return absl::InvalidArgumentError(absl::StrFormat("%s: record %s has %d bytes; %d parameters expected", *path,
                                                          next->first, next->second, groups[next_group].count));
      }
      values.resize(groups[next_group].count);
      if (absl::Status s = (*reader)->Read(next->first, values.data(), next->second); !s.ok()) return s;
      held = static_cast<int>(next_group++);
    }
    std::memcpy(out, values.data() + (layout[e].offset - groups[g].first), layout[e].count * sizeof(float));
    return absl::OkStatus();
  };
  return hf::ExportHfCheckpoint(config, to, read, options);
}

}  // namespace tierd::trainer
