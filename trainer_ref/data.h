// Training data: a byte-level tokenizer (a token is a byte; vocabulary 256) over text, or
// pre-tokenized binary shards, split into train and validation, served as random windows.
//
// Sources (`--data`):
//   "embedded"          a deterministic synthetic corpus built in (no download): sentences
//                       from a small grammar, so a tiny model visibly learns it;
//   a directory of shards  tools/tokenize.py's output: index.json naming shard-N.u32 files
//                       (or, without an index, every *.u32 / *.u16 file, sorted by name);
//   a directory         else every *.txt file in it (sorted by name), as bytes;
//   FILE.u16 / FILE.u32 little-endian token ids of that width (pre-tokenized shards);
//   any other file      its bytes.
// A shard FILE.u32 may have a loss mask beside it, FILE.mask: a byte per token, 1 where the
// token is trained as a target, 0 where it is not (an instruction's prompt: only responses
// are learned). Targets not trained are -1 in the batches (counted by no loss).
#ifndef TIERD_TRAINER_REF_DATA_H_
#define TIERD_TRAINER_REF_DATA_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd::trainer {

inline constexpr int kByteVocab = 256;

struct Dataset {
  std::vector<int32_t> train, val;
  // Per token whether it is trained as a target (1) or not (0), or empty: every token is.
  std::vector<uint8_t> train_mask, val_mask;
  std::string source;  // what was read, for the progress line
};

std::string EmbeddedCorpus();

// `val_fraction` of the tokens (the tail) is held out. Errors name the file and the number:
// NOT_FOUND (missing), INVALID_ARGUMENT (a shard whose size is not a whole number of
// tokens, a token id >= vocab, a directory with no .txt, too few tokens to give both
// splits at least seq + 1), DATA_LOSS (a read that came up short).
absl::StatusOr<Dataset> LoadDataset(const std::string& source, int vocab, int seq, double val_fraction);

// Random windows of seq + 1 tokens: inputs are the first seq, targets the last seq (-1 where
// `mask` says a token is not trained). Deterministic for a seed.
class Batcher {
 public:
  Batcher(const std::vector<int32_t>& tokens, int batch, int seq, uint64_t seed,
          const std::vector<uint8_t>* mask = nullptr);
  void Next(int32_t* inputs, int32_t* targets);  // each batch * seq
  // As if Next had been called `batches` times (a resumed run continues the same order).
  void Skip(int64_t batches) { rng_.discard(static_cast<uint64_t>(batches) * batch_); }

 private:
  const std::vector<int32_t>& tokens_;
  const std::vector<uint8_t>* mask_;  // null or empty: every target trained
  int batch_, seq_;
  std::mt19937_64 rng_;
};

// The held-out windows a validation loss is taken over: `batches` batches of a Batcher over
// the validation tokens with this seed, the same every time.
inline constexpr uint64_t kValidationSeed = 12345;

// --validation_out: those windows and the loss the trainer took over them, as JSON
// ({"step", "validation_loss", "batch", "seq", "batches": [{"inputs": [...], "targets":
// [...]}]}), for checking an exported model against it elsewhere (tools/hf/check_export.py).
// Written aside and renamed.
absl::Status WriteValidationWindows(const std::string& path, const std::vector<int32_t>& val, int batch, int seq,
                                    int batches, int64_t step, double loss, const std::vector<uint8_t>* mask = nullptr);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_DATA_H_
