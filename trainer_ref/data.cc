#include "trainer_ref/data.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrFormat("cannot read '%s': %s", path, std::strerror(errno)));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0);
  std::string bytes(static_cast<size_t>(std::max<std::streamoff>(size, 0)), '\0');
  if (!in.read(bytes.data(), size)) {
    return absl::DataLossError(absl::StrFormat("'%s': read fewer than its %d bytes", path, size));
  }
  return bytes;
}

std::vector<int32_t> Bytes(const std::string& text) {
  std::vector<int32_t> t(text.size());
  for (size_t i = 0; i < text.size(); ++i) t[i] = static_cast<unsigned char>(text[i]);
  return t;
}

absl::StatusOr<std::vector<int32_t>> Shard(const std::string& path, int width, int vocab) {
  auto bytes = ReadFile(path);
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
    auto text = ReadFile(f);
    if (!text.ok()) return text.status();
    all += *text;
  }
  return Bytes(all);
}

}  // namespace

absl::StatusOr<Dataset> LoadDataset(const std::string& source, int vocab, int seq, double val_fraction) {
  absl::StatusOr<std::vector<int32_t>> tokens;
  std::string what = source;
  struct stat st;
  if (source.empty() || source == "embedded") {
    tokens = Bytes(EmbeddedCorpus());
    what = "the embedded corpus";
  } else if (stat(source.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrFormat("--data '%s' does not exist", source));
  } else if (S_ISDIR(st.st_mode)) {
    tokens = TextDirectory(source);
  } else if (absl::EndsWith(source, ".u16")) {
    tokens = Shard(source, 2, vocab);
  } else if (absl::EndsWith(source, ".u32")) {
    tokens = Shard(source, 4, vocab);
  } else {
    auto text = ReadFile(source);
    if (!text.ok()) return text.status();
    tokens = Bytes(*text);
  }
  if (!tokens.ok()) return tokens.status();
  if (vocab < kByteVocab && !absl::EndsWith(source, ".u16") && !absl::EndsWith(source, ".u32")) {
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
  return d;
}

Batcher::Batcher(const std::vector<int32_t>& tokens, int batch, int seq, uint64_t seed)
    : tokens_(tokens), batch_(batch), seq_(seq), rng_(seed) {}

void Batcher::Next(int32_t* inputs, int32_t* targets) {
  const size_t windows = tokens_.size() - seq_;  // LoadDataset made sure this is >= 1
  for (int b = 0; b < batch_; ++b) {
    const size_t start = rng_() % windows;
    std::copy(tokens_.begin() + start, tokens_.begin() + start + seq_, inputs + int64_t{b} * seq_);
    std::copy(tokens_.begin() + start + 1, tokens_.begin() + start + 1 + seq_, targets + int64_t{b} * seq_);
  }
}

absl::Status WriteValidationWindows(const std::string& path, const std::vector<int32_t>& val, int batch, int seq,
                                    int batches, int64_t step, double loss) {
  Batcher windows(val, batch, seq, kValidationSeed);
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * seq), targets(inputs.size());
  std::string out = absl::StrFormat("{\"step\": %d, \"validation_loss\": %.9g, \"batch\": %d, \"seq\": %d, \"batches\": [",
                                    step, loss, batch, seq);
  for (int b = 0; b < batches; ++b) {
    windows.Next(inputs.data(), targets.data());
    absl::StrAppend(&out, b == 0 ? "" : ",", "\n{\"inputs\": [", absl::StrJoin(inputs, ","), "], \"targets\": [",
                    absl::StrJoin(targets, ","), "]}");
  }
  out += "\n]}\n";
  const std::string partial = path + ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (f == nullptr) return absl::PermissionDeniedError(absl::StrFormat("cannot write '%s'", partial));
  const bool written = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    return absl::ResourceExhaustedError(absl::StrFormat("writing '%s' failed (disk full?)", path));
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer
