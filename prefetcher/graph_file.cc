#include "prefetcher/graph_file.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"

namespace tierd::prefetcher {
namespace {

absl::Status Error(const YAML::Node& node, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("graph line %d: %s", node.Mark().line + 1, what));
}

absl::Status CheckKeys(const YAML::Node& map, const std::string& where, const std::set<std::string>& allowed) {
  if (!map.IsMap()) return Error(map, where + " must be a mapping");
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    if (allowed.count(key) == 0) {
      return Error(entry.first, absl::StrFormat("unknown key '%s' in %s (known: %s)", key, where,
                                                absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Graph> ParseGraphYaml(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("graph line %d: %s", e.mark.line + 1, e.msg));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("a graph file is a mapping with 'tensors' and 'ops'");
  if (absl::Status s = CheckKeys(root, "the graph", {"host", "tensors", "ops"}); !s.ok()) return s;
  if (!root["tensors"] || !root["tensors"].IsSequence()) return Error(root, "'tensors' must be a list");
  if (!root["ops"] || !root["ops"].IsSequence()) return Error(root, "'ops' must be a list");
  Graph g;
  std::map<std::string, TensorIndex> index;
  try {
    if (root["host"]) g.host = root["host"].as<bool>();
    for (const YAML::Node& t : root["tensors"]) {
      if (absl::Status s = CheckKeys(t, "a tensor", {"name", "bytes", "pinned"}); !s.ok()) return s;
      if (!t["name"] || !t["bytes"]) return Error(t, "a tensor needs 'name' and 'bytes'");
      const std::string name = t["name"].as<std::string>();
      auto bytes = ParseBytes(t["bytes"].as<std::string>());
      if (!bytes.ok()) return Error(t["bytes"], std::string(bytes.status().message()));
      if (!index.emplace(name, g.tensors.size()).second) return Error(t, "tensor '" + name + "' is listed twice");
      g.tensors.push_back({name, *bytes, t["pinned"] ? t["pinned"].as<bool>() : false});
    }
    for (const YAML::Node& o : root["ops"]) {
      if (absl::Status s = CheckKeys(o, "an op", {"name", "seconds", "reads", "writes", "overwrites", "host_reads", "host_writes",
                                             "host_overwrites"}); !s.ok()) {
        return s;
      }
      if (!o["name"]) return Error(o, "an op needs a 'name'");
      GraphOp op{o["name"].as<std::string>(), {}, {}, o["seconds"] ? o["seconds"].as<double>() : 0.0};
      for (auto [key, list] : {std::pair{"reads", &op.reads}, std::pair{"writes", &op.writes},
                               std::pair{"overwrites", &op.overwrites}, std::pair{"host_reads", &op.host_reads},
                               std::pair{"host_writes", &op.host_writes},
                               std::pair{"host_overwrites", &op.host_overwrites}}) {
        if (!o[key]) continue;
        if (!o[key].IsSequence()) return Error(o[key], std::string(key) + " must be a list of tensor names");
        for (const YAML::Node& name : o[key]) {
          auto it = index.find(name.as<std::string>());
          if (it == index.end()) {
            return Error(name, absl::StrFormat("op '%s' names tensor '%s', which 'tensors' does not list", op.name,
                                               name.as<std::string>()));
          }
          list->push_back(it->second);
        }
      }
      g.ops.push_back(std::move(op));
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("graph line %d: %s", e.mark.line + 1, e.msg));
  }
  if (absl::Status s = ValidateGraph(g); !s.ok()) return s;
  return g;
}

absl::StatusOr<Graph> LoadGraphFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read graph file '%s'", path));
  std::stringstream text;
  text << in.rdbuf();
  auto graph = ParseGraphYaml(text.str());
  if (!graph.ok()) return absl::Status(graph.status().code(), path + ": " + std::string(graph.status().message()));
  return graph;
}

std::string GraphToYaml(const Graph& g) {
  std::string out = g.host ? "host: true   # acquired in DRAM: DRAM over NVMe is planned\ntensors:\n" : "tensors:\n";
  for (const GraphTensor& t : g.tensors) {
    out += absl::StrFormat("  - {name: %s, bytes: %d%s}\n", t.name, t.bytes, t.pinned_gpu ? ", pinned: true" : "");
  }
  out += "ops:\n";
  auto names = [&](const std::vector<TensorIndex>& list) {
    std::vector<std::string> n;
    for (TensorIndex t : list) n.push_back(g.tensors[t].name);
    return "[" + absl::StrJoin(n, ", ") + "]";
  };
  for (const GraphOp& op : g.ops) {
    out += absl::StrFormat("  - {name: %s, seconds: %.17g", op.name, op.seconds);
    if (!op.reads.empty()) out += ", reads: " + names(op.reads);
    if (!op.writes.empty()) out += ", writes: " + names(op.writes);
    if (!op.overwrites.empty()) out += ", overwrites: " + names(op.overwrites);
    if (!op.host_reads.empty()) out += ", host_reads: " + names(op.host_reads);
    if (!op.host_writes.empty()) out += ", host_writes: " + names(op.host_writes);
    if (!op.host_overwrites.empty()) out += ", host_overwrites: " + names(op.host_overwrites);
    out += "}\n";
  }
  return out;
}

}  // namespace tierd::prefetcher
