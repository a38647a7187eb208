#include "trainer_ref/hf/hf_checkpoint.h"

#include <sys/stat.h>
#include <dirent.h>

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/units.h"
#include "trainer_ref/file_io.h"
#include "trainer_ref/hf/json.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/parallel.h"

namespace tierd::trainer::hf {
namespace {

// This decoder's name within a layer -> Hugging Face's.
const std::map<std::string, std::string>& LayerNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"attn_norm.w", "input_layernorm.weight"},
      {"attn.wq", "self_attn.q_proj.weight"},
      {"attn.wk", "self_attn.k_proj.weight"},
      {"attn.wv", "self_attn.v_proj.weight"},
      {"attn.wo", "self_attn.o_proj.weight"},
      {"attn.bq", "self_attn.q_proj.bias"},
      {"attn.bk", "self_attn.k_proj.bias"},
      {"attn.bv", "self_attn.v_proj.bias"},
      {"mlp_norm.w", "post_attention_layernorm.weight"},
      {"mlp.w1", "mlp.gate_proj.weight"},
      {"mlp.w3", "mlp.up_proj.weight"},
      {"mlp.w2", "mlp.down_proj.weight"},
  };
  return *names;
}

// How many heads' rows a tensor's RoPE permutation runs over (0: not permuted).
int RopeHeads(const ModelConfig& config, const std::string& ours) {
  if (absl::EndsWith(ours, ".attn.wq") || absl::EndsWith(ours, ".attn.bq")) return config.heads;
  if (absl::EndsWith(ours, ".attn.wk") || absl::EndsWith(ours, ".attn.bk")) return config.kv_head_count();
  return 0;
}

// Row r of a head in this decoder's order holds Hugging Face's row Source(r): 2i + j <- i + j D/2.
int64_t HfRowOf(int64_t row, int64_t d) {
  const int64_t head = row / d, r = row % d;
  return head * d + (r / 2) + (r % 2) * (d / 2);
}

std::string ShapeText(const std::vector<int64_t>& shape) { return "[" + absl::StrJoin(shape, ", ") + "]"; }

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The files a checkpoint's shards are in: the index's, or model.safetensors.
absl::StatusOr<std::vector<std::string>> ShardFiles(const std::string& dir, std::map<std::string, std::string>* map) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (!Exists(index)) {
    if (Exists(dir + "/model.safetensors")) return std::vector<std::string>{"model.safetensors"};
    return absl::NotFoundError(absl::StrFormat(
        "'%s' has neither model.safetensors nor model.safetensors.index.json (a PyTorch .bin checkpoint? "
        "transformers' save_pretrained writes safetensors)",
        dir));
  }
  auto text = ReadWholeFile(index);
  if (!text.ok()) return text.status();
  auto json = ParseJson(*text);
  if (!json.ok()) return absl::DataLossError(absl::StrFormat("'%s' %s", index, json.status().message()));
  const JsonValue* weights = json->Find("weight_map");
  if (weights == nullptr || weights->kind != JsonValue::Kind::kObject) {
    return absl::DataLossError(absl::StrFormat("'%s' has no weight_map object", index));
  }
  std::vector<std::string> files;
  for (const auto& [name, file] : weights->members) {
    if (file.kind != JsonValue::Kind::kString || file.text.find('/') != std::string::npos) {
      return absl::DataLossError(absl::StrFormat("'%s': the file of '%s' is not a file name", index, name));
    }
    (*map)[name] = file.text;
    if (std::find(files.begin(), files.end(), file.text) == files.end()) files.push_back(file.text);
  }
  return files;
}

}  // namespace

std::string HfName(const std::string& ours) {
  if (ours == "embed.w") return "model.embed_tokens.weight";
  if (ours == "final_norm.w") return "model.norm.weight";
  if (ours == "head.w") return "lm_head.weight";
  // layers.N.<rest>
  const size_t dot = ours.find('.', 7);
  if (absl::StartsWith(ours, "layers.") && dot != std::string::npos) {
    const auto it = LayerNames().find(ours.substr(dot + 1));
    if (it != LayerNames().end()) return "model." + ours.substr(0, dot + 1) + it->second;
  }
  return ours;
}

absl::StatusOr<std::unique_ptr<HfCheckpointReader>> HfCheckpointReader::Open(const std::string& dir,
                                                                             const ModelConfig& config) {
  std::unique_ptr<HfCheckpointReader> r(new HfCheckpointReader());
  r->config_ = config;
  r->layout_ = ParamLayout(config);
  std::map<std::string, std::string> index;
  auto files = ShardFiles(dir, &index);
  if (!files.ok()) return files.status();
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> found;
  std::set<std::string> dtypes;
  for (const std::string& name : *files) {
    auto file = SafetensorsFile::Open(dir + "/" + name);
    if (!file.ok()) return file.status();
    for (const TensorInfo& t : (*file)->tensors()) {
      found[t.name] = {file->get(), &t};
      dtypes.insert(absl::AsciiStrToLower(DtypeName(t.dtype)));
    }
    struct stat st {};
    ::stat((dir + "/" + name).c_str(), &st);
    r->file_bytes_ += static_cast<uint64_t>(st.st_size);
    r->files_.push_back(std::move(*file));
  }
  for (const auto& [name, file] : index) {
    const auto it = found.find(name);
    if (it == found.end() || !absl::EndsWith(it->second.first->path(), "/" + file)) {
      return absl::DataLossError(
          absl::StrFormat("'%s/model.safetensors.index.json' puts '%s' in '%s', which does not hold it", dir, name,
                          file));
    }
  }
  std::set<std::string> used;
  for (const TensorLayout& t : r->layout_) {
    const std::string name = HfName(t.name);
    const auto it = found.find(name);
    if (it == found.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint '%s' has no tensor '%s' (%s, shape %s) that this model's config.json calls for", dir, name,
          t.name, ShapeText(t.shape)));
    }
    if (it->second.second->shape != t.shape) {
      return absl::InvalidArgumentError(absl::StrFormat("checkpoint '%s': '%s' is %s there; this config needs %s",
                                                        dir, name, ShapeText(it->second.second->shape),
                                                        ShapeText(t.shape)));
    }
    r->where_.push_back(it->second);
    used.insert(name);
  }
  std::vector<std::string> extra;
  for (const auto& [name, where] : found) {
    const bool buffer = absl::EndsWith(name, "rotary_emb.inv_freq");
    const bool tied_head = config.tied_embeddings && name == "lm_head.weight";
    if (used.count(name) == 0 && !buffer && !tied_head) {
      extra.push_back(absl::StrFormat("'%s' %s", name, ShapeText(where.second->shape)));
    }
  }
  if (!extra.empty()) {
    if (extra.size() > 5) extra.resize(5), extra.push_back("...");
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint '%s' has tensors this model has no place for: %s (is config.json the checkpoint's own?)", dir,
        absl::StrJoin(extra, ", ")));
  }
  r->dtypes_ = absl::StrJoin(dtypes, "+");
  return r;
}

absl::Status HfCheckpointReader::Read(size_t entry, float* out) const {
  if (entry >= layout_.size()) return absl::OutOfRangeError(absl::StrFormat("entry %d of %d", entry, layout_.size()));
  const TensorLayout& t = layout_[entry];
  const auto [file, tensor] = where_[entry];
  // Row by row on the host's threads (a 7-8B checkpoint holds 8e9 values to convert).
  const int heads = RopeHeads(config_, t.name);
  const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1;  // a vector: a value a row
  const int64_t rows = static_cast<int64_t>(t.count) / width, d = heads > 0 ? rows / heads : 1;
  ParallelFor(rows, static_cast<double>(t.count), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t from = heads > 0 ? HfRowOf(row, d) : row;
      file->ReadFloats(*tensor, static_cast<uint64_t>(from * width), static_cast<uint64_t>(width), out + row * width);
    }
  });
  file->DoneWith(*tensor);
  return absl::OkStatus();
}

std::string HfCheckpointReader::Describe() const {
  return absl::StrFormat("%d file%s, %s, %s", files_.size(), files_.size() == 1 ? "" : "s", FormatBytes(file_bytes_),
                         dtypes_);
}

absl::Status CheckExportDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return absl::OkStatus();  // made when the export is written
  int entries = 0;
  while (const dirent* e = ::readdir(d)) entries += std::string(e->d_name) != "." && std::string(e->d_name) != "..";
  ::closedir(d);
  if (entries > 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "--export directory '%s' holds %d files already; give a new or empty directory (nothing is overwritten)", dir,
        entries));
  }
  return absl::OkStatus();
}

std::string HfConfigJson(const ModelConfig& c) {
  const bool qwen = c.qkv_bias, mistral = !qwen && c.sliding_window > 0;
  const char* arch = qwen ? "Qwen2ForCausalLM" : mistral ? "MistralForCausalLM" : "LlamaForCausalLM";
  const char* type = qwen ? "qwen2" : mistral ? "mistral" : "llama";
  std::string rope = "null";
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScaling::Type::kLinear) rope = absl::StrFormat(R"({"factor": %.17g, "rope_type": "linear"})", r.factor);
  if (r.type == RopeScaling::Type::kLlama3) {
    rope = absl::StrFormat(
        R"({"factor": %.17g, "high_freq_factor": %.17g, "low_freq_factor": %.17g, "original_max_position_embeddings": %d, "rope_type": "llama3"})",
        r.factor, r.high_freq_factor, r.low_freq_factor, r.original_max_position);
  }
  std::vector<std::string> lines = {
      absl::StrFormat(R"("architectures": ["%s"])", arch),
      absl::StrFormat(R"("model_type": "%s")", type),
      absl::StrFormat(R"("hidden_size": %d)", c.d_model),
      absl::StrFormat(R"("intermediate_size": %d)", c.d_ff),
      absl::StrFormat(R"("num_hidden_layers": %d)", c.layers),
      absl::StrFormat(R"("num_attention_heads": %d)", c.heads),
      absl::StrFormat(R"("num_key_value_heads": %d)", c.kv_head_count()),
      absl::StrFormat(R"("head_dim": %d)", c.head_dim()),
      absl::StrFormat(R"("vocab_size": %d)", c.vocab),
      absl::StrFormat(R"("max_position_embeddings": %d)", c.max_seq),
      absl::StrFormat(R"("rms_norm_eps": %.17g)", c.norm_eps),
      absl::StrFormat(R"("rope_theta": %.17g)", c.rope_theta),
      absl::StrFormat(R"("rope_scaling": %s)", rope),
      absl::StrFormat(R"("tie_word_embeddings": %s)", c.tied_embeddings ? "true" : "false"),
      R"("hidden_act": "silu")",
      R"("torch_dtype": "bfloat16")",
  };
  if (qwen) lines.push_back(R"("use_sliding_window": false)");
  if (!qwen) lines.push_back(R"("attention_bias": false)");
  if (!qwen) lines.push_back(R"("mlp_bias": false)");
  if (mistral) lines.push_back(absl::StrFormat(R"("sliding_window": %d)", c.sliding_window));
  return "{\n  " + absl::StrJoin(lines, ",\n  ") + "\n}\n";
}

absl::Status ExportHfCheckpoint(const ModelConfig& config, const std::string& dir, const EntryReader& read,
                                const ExportOptions& options) {
  if (absl::Status s = CheckExportDir(dir); !s.ok()) return s;
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrFormat("cannot make the export directory '%s'", dir));
  }
  const std::vector<TensorLayout> layout = ParamLayout(config);
  const int value_bytes = DtypeBytes(options.dtype);
  // Shards: tensors in layout order, a new shard when the next would pass the limit.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t e = 0; e < layout.size(); ++e) {
    const uint64_t bytes = layout[e].count * value_bytes;
    if (!shards.back().empty() && in_shard + bytes > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(e);
    in_shard += bytes;
    total += bytes;
  }
  std::map<std::string, std::string> weight_map;
  std::vector<float> values;
  std::vector<unsigned char> bytes;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shards.size() == 1 ? "model.safetensors"
                                                : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    std::vector<TensorInfo> infos;
    for (size_t e : shards[s]) {
      TensorInfo t;
      t.name = HfName(layout[e].name);
      t.dtype = options.dtype;
      t.shape = layout[e].shape;
      infos.push_back(t);
      weight_map[t.name] = file;
    }
    auto writer = SafetensorsWriter::Create(dir + "/" + file, infos, {{"format", "pt"}});
    if (!writer.ok()) return writer.status();
    for (size_t e : shards[s]) {
      const TensorLayout& t = layout[e];
      values.resize(t.count);
      if (absl::Status st = read(e, values.data()); !st.ok()) return st;
      bytes.resize(t.count * value_bytes);
      const int heads = RopeHeads(config, t.name);
      const int64_t width = t.shape.size() > 1 ? t.shape[1] : 1, d = heads > 0 ? t.shape[0] / heads : 1;
      ParallelFor(static_cast<int64_t>(t.count / width), static_cast<double>(t.count), [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t to = heads > 0 ? HfRowOf(row, d) : row;  // back to Hugging Face's row order
          for (int64_t k = 0; k < width; ++k) {
            const float x = values[row * width + k];
            unsigned char* p = bytes.data() + (to * width + k) * value_bytes;
            if (options.dtype == Dtype::kF32) {
              std::memcpy(p, &x, 4);
            } else {  // bf16, rounded to nearest even (fp16 is read, not written)
              const uint16_t b = Bf16Bits(x);
              p[0] = static_cast<unsigned char>(b), p[1] = static_cast<unsigned char>(b >> 8);
            }
          }
        }
      });
      if (absl::Status st = (*writer)->Write(bytes.data(), bytes.size()); !st.ok()) return st;
    }
    if (absl::Status st = (*writer)->Finish(); !st.ok()) return st;
    if (options.progress) {
      options.progress(absl::StrFormat("export: %s (%d tensors, %s)", file, shards[s].size(),
                                       FormatBytes((*writer)->Bytes())));
    }
  }
  if (shards.size() > 1) {
    std::vector<std::string> entries;
    for (const auto& [name, file] : weight_map) entries.push_back(absl::StrFormat("    %s: %s", JsonQuote(name), JsonQuote(file)));
    const std::string index = absl::StrFormat("{\n  \"metadata\": {\"total_size\": %d},\n  \"weight_map\": {\n%s\n  }\n}\n",
                                              total, absl::StrJoin(entries, ",\n"));
    if (absl::Status st = WriteFileAside(dir + "/model.safetensors.index.json", index); !st.ok()) return st;
  }
  std::string config_json = HfConfigJson(config);
  if (!options.source_dir.empty()) {
    auto source = ReadWholeFile(options.source_dir + "/config.json");
    if (source.ok()) config_json = *source;
  }
  if (absl::Status st = WriteFileAside(dir + "/config.json", config_json); !st.ok()) return st;
  if (!options.source_dir.empty()) {
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                             "generation_config.json", "vocab.json", "merges.txt", "added_tokens.json",
                             "chat_template.jinja", "chat_template.json"}) {
      auto text = ReadWholeFile(options.source_dir + "/" + name);
      if (!text.ok()) continue;  // not every model has every file
      if (absl::Status st = WriteFileAside(dir + "/" + name, *text); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer::hf
