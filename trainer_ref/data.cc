#include "trainer_ref/data.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer_ref/file_io.h"
#include "trainer_ref/hf/json.h"

namespace tierd::trainer {

std::string EmbeddedCorpus() {
  // A small grammar, a fixed seed: about 200 KB of sentences with regular structure
  // (subject verb object, agreement, a closing period), learnable by a tiny model.
  static const char* kSubjects[] = {"the cat", "a dog", "the old man", "my sister", "the bird", "our teacher",
                                    "the child", "a farmer"};
  static const char* kVerbs[] = {"sees", "finds", "likes", "follows", "paints", "carries", "watches", "feeds"};
  static const char* kObjects[] = {"the red ball", "a small house", "the river", "an apple", "the green hill",
                                   "a wooden boat", "the morning sun", "a quiet song"};
  static const char* kTails[] = {"", " every day", " in the garden", " near the sea", " after dinner"};
  std::mt19937_64 rng(20261129);
  std::string out;
  while (out.size() < 200000) {
    out += kSubjects[rng() % 8];
    out += ' ';
    out += kVerbs[rng() % 8];
    out += ' ';
    out += kObjects[rng() % 8];
    out += kTails[rng() % 5];
    out += ".\n";
  }
  return out;
}

namespace {

std::vector<int32_t> Bytes(const std::string& text) {
  std::vector<int32_t> t(text.size());
  for (size_t i = 0; i < text.size(); ++i) t[i] = static_cast<unsigned char>(text[i]);
  return t;
}

absl::StatusOr<std::vector<int32_t>> Shard(const std::string& path, int width, int vocab) {
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() % width != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' has %d bytes, not a whole number of %d-byte tokens: is it really a .u%d shard?", path, bytes->size(),
        width, width * 8));
  }
  std::vector<int32_t> tokens(bytes->size() / width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t id = 0;
    std::memcpy(&id, bytes->data() + i * width, width);  // little-endian hosts
    if (id >= static_cast<uint32_t>(vocab)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s': token %d at position %d is outside the model's vocabulary of %d", path, id, i, vocab));
    }
    tokens[i] = static_cast<int32_t>(id);
  }
  return tokens;
}

// A shard's loss mask, FILE.mask beside FILE.u32 (or .u16), checked against its tokens; absent:
// an empty vector (every token trained).
absl::StatusOr<std::vector<uint8_t>> ShardMask(const std::string& shard, size_t tokens) {
  const std::string path = shard.substr(0, shard.rfind('.')) + ".mask";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::vector<uint8_t>();
  auto bytes = ReadWholeFile(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() != tokens) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' has %d bytes for the %d tokens of '%s' (a loss mask has one byte a token)", path, bytes->size(), tokens,
        shard));
  }
  std::vector<uint8_t> mask(bytes->begin(), bytes->end());
  for (size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] > 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("'%s': byte %d is %d; a loss mask holds 0 (not trained) or 1 (trained)", path, i, mask[i]));
    }
  }
  return mask;
}

struct Tokens {
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;  // empty: every token trained
};

// A directory's token shards: those its index.json names (tools/tokenize.py), in its order, or
// every .u32 / .u16 file sorted by name; with their masks. NOT_FOUND: no shards there.
absl::StatusOr<Tokens> ShardDirectory(const std::string& dir, int vocab) {
  std::vector<std::string> files;
  if (auto index = ReadWholeFile(dir + "/index.json"); index.ok()) {
    auto json = hf::ParseJson(*index);
    const hf::JsonValue* shards = json.ok() ? json->Find("shards") : nullptr;
    if (shards == nullptr || shards->kind != hf::JsonValue::Kind::kArray) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s/index.json' is not a shard index (tools/tokenize.py writes one: {\"shards\": [{\"file\": ...}]})%s", dir,
          json.ok() ? "" : ": " + std::string(json.status().message())));
    }
    for (const hf::JsonValue& shard : shards->items) {
      const hf::JsonValue* file = shard.Find("file");
      if (file == nullptr || file->kind != hf::JsonValue::Kind::kString || file->text.find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrFormat("'%s/index.json': a shard without a file name", dir));
      }
      files.push_back(dir + "/" + file->text);
    }
    if (files.empty()) return absl::InvalidArgumentError(absl::StrFormat("'%s/index.json' names no shards", dir));
  } else {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return absl::NotFoundError(absl::StrFormat("cannot open directory '%s'", dir));
    while (dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, ".u32") || absl::EndsWith(e->d_name, ".u16")) files.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
    if (files.empty()) return absl::NotFoundError(absl::StrFormat("'%s' has no token shards", dir));
    std::sort(files.begin(), files.end());
  }
  Tokens out;
  bool any_mask = false;
  for (const std::string& f : files) {
    auto ids = Shard(f, absl::EndsWith(f, ".u16") ? 2 : 4, vocab);
    if (!ids.ok()) return ids.status();
    auto mask = ShardMask(f, ids->size());
    if (!mask.ok()) return mask.status();
    if (!mask->empty() && !any_mask) {  // the shards before had none: all theirs trained
      out.mask.assign(out.ids.size(), 1);
      any_mask = true;
    }
    if (any_mask && mask->empty()) mask->assign(ids->size(), 1);
    out.ids.insert(out.ids.end(), ids->begin(), ids->end());
    out.mask.insert(out.mask.end(), mask->begin(), mask->end());
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> TextDirectory(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrFormat("cannot open directory '%s'", dir));
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    if (absl::EndsWith(e->d_name, ".txt")) files.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  if (files.empty()) return absl::InvalidArgumentError(absl::StrFormat("'%s' has no .txt files", dir));
  std::sort(files.begin(), files.end());
  std::string all;
  for (const std::string& f : files) {
    auto text = ReadWholeFile(f);
    if (!text.ok()) return text.status();
    all += *text;
  }
  return Bytes(all);
}

}  // namespace

absl::StatusOr<Dataset> LoadDataset(const std::string& source, int vocab, int seq, double val_fraction) {
  absl::StatusOr<std::vector<int32_t>> tokens;
  std::vector<uint8_t> mask;
  std::string what = source;
  bool token_ids = absl::EndsWith(source, ".u16") || absl::EndsWith(source, ".u32");
  struct stat st;
  if (source.empty() || source == "embedded") {
    tokens = Bytes(EmbeddedCorpus());
    what = "the embedded corpus";
  } else if (stat(source.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("--data '%s' does not exist", source));
  } else if (S_ISDIR(st.st_mode)) {
    auto shards = ShardDirectory(source, vocab);
    if (shards.ok()) {
      tokens = std::move(shards->ids);
      mask = std::move(shards->mask);
      token_ids = true;
    } else if (absl::IsNotFound(shards.status())) {
      tokens = TextDirectory(source);
    } else {
      return shards.status();
    }
  } else if (token_ids) {
    tokens = Shard(source, absl::EndsWith(source, ".u16") ? 2 : 4, vocab);
    if (tokens.ok()) {
      auto m = ShardMask(source, tokens->size());
      if (!m.ok()) return m.status();
      mask = std::move(*m);
    }
  } else {
    auto text = ReadWholeFile(source);
    if (!text.ok()) return text.status();
    tokens = Bytes(*text);
  }
  if (!tokens.ok()) return tokens.status();
  if (vocab < kByteVocab && !token_ids) {
    return absl::InvalidArgumentError(absl::StrFormat("byte-level text needs a vocabulary of %d; the model has %d",
                                                      kByteVocab, vocab));
  }
  const size_t val = static_cast<size_t>(tokens->size() * val_fraction);
  const size_t need = static_cast<size_t>(seq) + 1;
  if (tokens->size() - val < need || (val_fraction > 0 && val < need)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d tokens: too few for windows of %d in both train and validation (%.0f%% held out)", what,
        tokens->size(), need, 100 * val_fraction));
  }
  Dataset d;
  d.source = absl::StrFormat("%s (%d tokens)", what, tokens->size());
  d.train.assign(tokens->begin(), tokens->end() - val);
  d.val.assign(tokens->end() - val, tokens->end());
  if (!mask.empty()) {
    size_t trained = 0;
    for (uint8_t m : mask) trained += m;
    if (trained == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("%s: its loss mask trains no token", what));
    }
    d.source += absl::StrFormat(", %.1f%% of them trained (a loss mask)", 100.0 * trained / mask.size());
    d.train_mask.assign(mask.begin(), mask.end() - val);
    d.val_mask.assign(mask.end() - val, mask.end());
  }
  return d;
}

Batcher::Batcher(const std::vector<int32_t>& tokens, int batch, int seq, uint64_t seed,
                 const std::vector<uint8_t>* mask)
    : tokens_(tokens), mask_(mask), batch_(batch), seq_(seq), rng_(seed) {}

void Batcher::Next(int32_t* inputs, int32_t* targets) {
  const size_t windows = tokens_.size() - seq_;  // LoadDataset made sure this is >= 1
  for (int b = 0; b < batch_; ++b) {
    const size_t start = rng_() % windows;
    std::copy(tokens_.begin() + start, tokens_.begin() + start + seq_, inputs + int64_t{b} * seq_);
    std::copy(tokens_.begin() + start + 1, tokens_.begin() + start + 1 + seq_, targets + int64_t{b} * seq_);
    if (mask_ == nullptr || mask_->empty()) continue;
    for (int j = 0; j < seq_; ++j) {
      if ((*mask_)[start + 1 + j] == 0) targets[int64_t{b} * seq_ + j] = -1;
    }
  }
}

absl::Status WriteValidationWindows(const std::string& path, const std::vector<int32_t>& val, int batch, int seq,
                                    int batches, int64_t step, double loss, const std::vector<uint8_t>* mask) {
  Batcher windows(val, batch, seq, kValidationSeed, mask);
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * seq), targets(inputs.size());
  std::string out = absl::StrFormat("{\"step\": %d, \"validation_loss\": %.9g, \"batch\": %d, \"seq\": %d, \"batches\": [",
                                    step, loss, batch, seq);
  for (int b = 0; b < batches; ++b) {
    windows.Next(inputs.data(), targets.data());
    absl::StrAppend(&out, b == 0 ? "" : ",", "\n{\"inputs\": [", absl::StrJoin(inputs, ","), "], \"targets\": [",
                    absl::StrJoin(targets, ","), "]}");
  }
  out += "\n]}\n";
  return WriteFileAside(path, out);
}

}  // namespace tierd::trainer
