// Hugging Face checkpoints of the Llama family (Llama 2/3, Mistral, Qwen2) in and out:
// config.json and model.safetensors, or model-0000N-of-0000M.safetensors with
// model.safetensors.index.json, tensors in bf16, fp16 or fp32.
//
// Names: model.embed_tokens.weight <-> embed.w, model.layers.N.input_layernorm.weight <->
// layers.N.attn_norm.w, self_attn.{q,k,v,o}_proj.weight <-> attn.w{q,k,v,o}, self_attn.
// {q,k,v}_proj.bias <-> attn.b{q,k,v}, post_attention_layernorm.weight <-> mlp_norm.w,
// mlp.{gate,up,down}_proj.weight <-> mlp.w{1,3,2}, model.norm.weight <-> final_norm.w,
// lm_head.weight <-> head.w (absent when tied).
//
// RoPE: Hugging Face's Llama turns the pairs (i, i + D/2) of a head, this decoder the pairs
// (2i, 2i+1). Reading, each head's rows of q_proj and k_proj (and their biases) are permuted
// so that row 2i + j is Hugging Face's row i + j D/2; writing, back. The attention scores, and
// so the logits, are the same.
#ifndef TIERD_TRAINER_REF_HF_HF_CHECKPOINT_H_
#define TIERD_TRAINER_REF_HF_HF_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/hf/safetensors.h"
#include "trainer_ref/model.h"

namespace tierd::trainer::hf {

// Hugging Face's name of a tensor of ParamLayout(config) ("layers.3.attn.wq" ->
// "model.layers.3.self_attn.q_proj.weight").
std::string HfName(const std::string& ours);

// Reads a checkpoint directory's tensors into this decoder's layout, a tensor at a time, so a
// checkpoint never needs to be whole in memory (its files are mapped; their pages are page
// cache the kernel can take back).
class HfCheckpointReader {
 public:
  // Opens `dir` for a model of `config` (ModelConfigFromFile(dir/config.json), usually) and
  // checks every tensor: INVALID_ARGUMENT naming a missing tensor, one the decoder has no
  // place for (except rotary inv_freq buffers and, tied, lm_head.weight), or one of another
  // shape (both shapes said); DATA_LOSS for a damaged file (its path and byte offset);
  // NOT_FOUND for a directory without model.safetensors or an index.
  static absl::StatusOr<std::unique_ptr<HfCheckpointReader>> Open(const std::string& dir, const ModelConfig& config);
  // Entry `entry` of ParamLayout(config) as fp32 into out (its count): converted from the
  // file's dtype, q/k rows permuted for RoPE.
  absl::Status Read(size_t entry, float* out) const;
  // "4 files, 221.8 KB, bf16" for the startup line.
  std::string Describe() const;

 private:
  HfCheckpointReader() = default;
  ModelConfig config_;
  std::vector<TensorLayout> layout_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // Per layout entry: the file and tensor that hold it.
  std::vector<std::pair<const SafetensorsFile*, const TensorInfo*>> where_;
  uint64_t file_bytes_ = 0;
  std::string dtypes_;
};

// Where an exported checkpoint's tensors come from: entry `entry` of ParamLayout(config) as
// fp32 into out (its count), in this decoder's layout.
using EntryReader = std::function<absl::Status(size_t entry, float* out)>;

struct ExportOptions {
  // Tensors in shards of at most this many bytes (a tensor larger than it alone in one), as
  // save_pretrained's max_shard_size; one shard is model.safetensors with no index.
  uint64_t max_shard_bytes = uint64_t{5} << 30;
  Dtype dtype = Dtype::kBF16;
  // A checkpoint directory the model came from (--init_from): its config.json is kept as is
  // and its tokenizer and generation files copied. Empty: config.json made from the config.
  std::string source_dir;
  // A line of progress per shard written (empty: quiet).
  std::function<void(const std::string&)> progress;
};

// Writes `dir` (made if missing; FAILED_PRECONDITION if it holds files already, so nothing is
// overwritten): config.json, the shards and their index, the source's tokenizer files. Each
// shard is written aside, synced and renamed; RESOURCE_EXHAUSTED when the disk is full.
absl::Status ExportHfCheckpoint(const ModelConfig& config, const std::string& dir, const EntryReader& read,
                                const ExportOptions& options);
// Whether `dir` may receive an export (missing, or an empty directory): checked at startup so
// a run does not end by refusing it.
absl::Status CheckExportDir(const std::string& dir);

// config.json for a model of `config` as transformers writes it for LlamaForCausalLM (or
// Qwen2ForCausalLM with q/k/v biases).
std::string HfConfigJson(const ModelConfig& config);

}  // namespace tierd::trainer::hf

#endif  // TIERD_TRAINER_REF_HF_HF_CHECKPOINT_H_
