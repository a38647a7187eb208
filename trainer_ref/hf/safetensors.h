// The safetensors format (Hugging Face's): an 8-byte little-endian header length N, N bytes of
// JSON naming each tensor's dtype, shape and [begin, end) within the data that follows, and
// the data. Read through mmap (the page cache holds the bytes, reclaimable, not the process's
// heap), checked whole at open; written streamed, synced and renamed into place.
#ifndef TIERD_TRAINER_REF_HF_SAFETENSORS_H_
#define TIERD_TRAINER_REF_HF_SAFETENSORS_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd::trainer::hf {

// The dtypes read and written (others, e.g. F8_E4M3 or I64, are refused by name).
enum class Dtype { kBF16, kF16, kF32 };
const char* DtypeName(Dtype dtype);  // "BF16", "F16", "F32"
int DtypeBytes(Dtype dtype);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // within the data, after the header
  uint64_t Count() const;
};

class SafetensorsFile {
 public:
  // Maps the file and checks it whole: the header's length and JSON, every tensor's dtype,
  // shape and range (inside the data, its bytes its shape's, none overlapping). DATA_LOSS
  // naming the file and the byte offset for a cut or damaged file; NOT_FOUND without it;
  // INVALID_ARGUMENT for a dtype not read.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* Find(const std::string& name) const;
  // Elements [first, first + count) of the tensor (row-major) as fp32 into out.
  void ReadFloats(const TensorInfo& tensor, uint64_t first, uint64_t count, float* out) const;
  // The tensor's bytes as stored.
  const unsigned char* Bytes(const TensorInfo& tensor) const { return data_ + tensor.begin; }
  // Tells the kernel the tensor's pages will not be read again (they leave the page cache).
  void DoneWith(const TensorInfo& tensor) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  void* map_ = nullptr;
  uint64_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes one safetensors file: the header from the tensors' names, dtypes and shapes (their
// ranges back to back in the order given), then each tensor's bytes, in that order, through
// Write. Into `path`.partial, synced and renamed to `path` by Finish; nothing at `path` until
// then. RESOURCE_EXHAUSTED naming the file when the disk is full.
class SafetensorsWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Create(
      const std::string& path, const std::vector<TensorInfo>& tensors,
      const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  // The next bytes of the tensors, in order (any split).
  absl::Status Write(const void* bytes, uint64_t n);
  absl::Status Finish();
  // The header and data bytes this file will have.
  uint64_t Bytes() const { return header_bytes_ + data_bytes_; }

 private:
  SafetensorsWriter() = default;
  std::string path_, partial_;
  std::FILE* file_ = nullptr;
  uint64_t header_bytes_ = 0, data_bytes_ = 0, written_ = 0;
};

// Half floats: IEEE 754 binary16 bits to fp32 (subnormals, infinities and NaN kept).
float HalfToFloat(uint16_t bits);

}  // namespace tierd::trainer::hf

#endif  // TIERD_TRAINER_REF_HF_SAFETENSORS_H_
