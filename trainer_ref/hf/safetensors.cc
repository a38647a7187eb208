#include "trainer_ref/hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "trainer_ref/hf/json.h"

namespace tierd::trainer::hf {
namespace {

// A header larger than this is not a header (the format's own reader caps it at 100 MB).
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

absl::Status Damaged(const std::string& path, uint64_t offset, const std::string& what) {
  return absl::DataLossError(absl::StrFormat("safetensors file '%s', byte %d: %s", path, offset, what));
}

bool ParseDtype(const std::string& name, Dtype* out) {
  if (name == "BF16") *out = Dtype::kBF16;
  else if (name == "F16") *out = Dtype::kF16;
  else if (name == "F32") *out = Dtype::kF32;
  else return false;
  return true;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

// One tensor's header entry into `out`; `at`: the header's offset in the file, for errors.
absl::Status ReadEntry(const std::string& path, const std::string& name, const JsonValue& entry, TensorInfo* out) {
  const uint64_t at = 8;  // the header starts after its length
  if (entry.kind != JsonValue::Kind::kObject) return Damaged(path, at, "tensor '" + name + "' is not an object");
  const JsonValue* dtype = entry.Find("dtype");
  const JsonValue* shape = entry.Find("shape");
  const JsonValue* offsets = entry.Find("data_offsets");
  if (dtype == nullptr || dtype->kind != JsonValue::Kind::kString || shape == nullptr ||
      shape->kind != JsonValue::Kind::kArray || offsets == nullptr || offsets->kind != JsonValue::Kind::kArray ||
      offsets->items.size() != 2) {
    return Damaged(path, at, "tensor '" + name + "' lacks a dtype, a shape or two data_offsets");
  }
  out->name = name;
  if (!ParseDtype(dtype->text, &out->dtype)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "safetensors file '%s': tensor '%s' is %s; BF16, F16 and F32 are read", path, name, dtype->text));
  }
  for (const JsonValue& d : shape->items) {
    uint64_t v = 0;
    if (!d.AsUint64(&v) || v > (uint64_t{1} << 40)) return Damaged(path, at, "tensor '" + name + "' has a bad shape");
    out->shape.push_back(static_cast<int64_t>(v));
  }
  if (!offsets->items[0].AsUint64(&out->begin) || !offsets->items[1].AsUint64(&out->end) || out->end < out->begin) {
    return Damaged(path, at, "tensor '" + name + "' has bad data_offsets");
  }
  if (out->end - out->begin != out->Count() * DtypeBytes(out->dtype)) {
    return Damaged(path, at,
                   absl::StrFormat("tensor '%s' of shape %s in %s needs %d bytes, its data_offsets give %d", name,
                                   ShapeText(out->shape), dtype->text, out->Count() * DtypeBytes(out->dtype),
                                   out->end - out->begin));
  }
  return absl::OkStatus();
}

}  // namespace

const char* DtypeName(Dtype dtype) {
  switch (dtype) {
    case Dtype::kBF16: return "BF16";
    case Dtype::kF16: return "F16";
    case Dtype::kF32: return "F32";
  }
  return "?";
}

int DtypeBytes(Dtype dtype) { return dtype == Dtype::kF32 ? 4 : 2; }

uint64_t TensorInfo::Count() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1f) {  // infinity or NaN
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? absl::NotFoundError(absl::StrFormat("safetensors file '%s' does not exist", path))
                           : absl::PermissionDeniedError(absl::StrFormat("cannot open '%s': %s", path,
                                                                         std::strerror(errno)));
  }
  struct stat st {};
  ::fstat(fd, &st);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  if (size < 8) {
    ::close(fd);
    return Damaged(path, size, absl::StrFormat("the file has %d bytes; the header's length alone takes 8", size));
  }
  file->map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (file->map_ == MAP_FAILED) {
    file->map_ = nullptr;
    return absl::InternalError(absl::StrFormat("cannot map '%s': %s", path, std::strerror(errno)));
  }
  file->map_bytes_ = size;
  const auto* bytes = static_cast<const unsigned char*>(file->map_);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | bytes[i];
  if (header > kMaxHeaderBytes || header > size - 8) {
    return Damaged(path, 0,
                   absl::StrFormat("the header's length says %d bytes, the file has %d after it (cut, or not "
                                   "safetensors)",
                                   header, size - 8));
  }
  auto json = ParseJson(std::string_view(reinterpret_cast<const char*>(bytes + 8), header));
  if (!json.ok()) return Damaged(path, 8, "the header is not JSON (" + std::string(json.status().message()) + ")");
  if (json->kind != JsonValue::Kind::kObject) return Damaged(path, 8, "the header is not a JSON object");
  file->data_ = bytes + 8 + header;
  const uint64_t data_bytes = size - 8 - header;
  for (const auto& [name, entry] : json->members) {
    if (name == "__metadata__") {
      for (const auto& [key, value] : entry.members) {
        if (value.kind == JsonValue::Kind::kString) file->metadata_[key] = value.text;
      }
      continue;
    }
    TensorInfo t;
    if (absl::Status s = ReadEntry(path, name, entry, &t); !s.ok()) return s;
    if (t.end > data_bytes) {
      return Damaged(path, 8 + header + t.end,
                     absl::StrFormat("tensor '%s' ends at byte %d of the data, which has %d (the file is cut)", name,
                                     t.end, data_bytes));
    }
    file->index_[name] = file->tensors_.size();
    file->tensors_.push_back(std::move(t));
  }
  std::vector<const TensorInfo*> by_begin;
  for (const TensorInfo& t : file->tensors_) by_begin.push_back(&t);
  std::sort(by_begin.begin(), by_begin.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_begin.size(); ++i) {
    if (by_begin[i]->begin < by_begin[i - 1]->end) {
      return Damaged(path, 8 + header + by_begin[i]->begin,
                     "tensors '" + by_begin[i - 1]->name + "' and '" + by_begin[i]->name + "' overlap");
    }
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::ReadFloats(const TensorInfo& t, uint64_t first, uint64_t count, float* out) const {
  const unsigned char* p = data_ + t.begin + first * DtypeBytes(t.dtype);
  switch (t.dtype) {
    case Dtype::kF32:
      std::memcpy(out, p, count * sizeof(float));
      return;
    case Dtype::kBF16:
      for (uint64_t i = 0; i < count; ++i) {
        const uint32_t bits = static_cast<uint32_t>(p[2 * i] | p[2 * i + 1] << 8) << 16;
        std::memcpy(out + i, &bits, sizeof(float));
      }
      return;
    case Dtype::kF16:
      for (uint64_t i = 0; i < count; ++i) out[i] = HalfToFloat(static_cast<uint16_t>(p[2 * i] | p[2 * i + 1] << 8));
      return;
  }
}

void SafetensorsFile::DoneWith(const TensorInfo& t) const {
  const long page = ::sysconf(_SC_PAGESIZE);
  const auto base = reinterpret_cast<uintptr_t>(data_ + t.begin) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(data_ + t.end);
  ::madvise(reinterpret_cast<void*>(base), end - base, MADV_DONTNEED);
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, const std::vector<TensorInfo>& tensors, const std::map<std::string, std::string>& meta) {
  std::string header = "{";
  if (!meta.empty()) {
    std::vector<std::string> entries;
    for (const auto& [k, v] : meta) entries.push_back(JsonQuote(k) + ":" + JsonQuote(v));
    header += "\"__metadata__\":{" + absl::StrJoin(entries, ",") + "}";
  }
  uint64_t at = 0;
  for (const TensorInfo& t : tensors) {
    const uint64_t bytes = t.Count() * DtypeBytes(t.dtype);
    if (header.size() > 1) header += ",";
    header += absl::StrFormat("%s:{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%d,%d]}", JsonQuote(t.name),
                              DtypeName(t.dtype), absl::StrJoin(t.shape, ","), at, at + bytes);
    at += bytes;
  }
  header += "}";
  while ((header.size() + 8) % 8 != 0) header += ' ';  // the data starts 8-byte aligned
  std::unique_ptr<SafetensorsWriter> w(new SafetensorsWriter());
  w->path_ = path;
  w->partial_ = path + ".partial";
  w->header_bytes_ = 8 + header.size();
  w->data_bytes_ = at;
  w->file_ = std::fopen(w->partial_.c_str(), "wb");
  if (w->file_ == nullptr) {
    return absl::PermissionDeniedError(absl::StrFormat("cannot create '%s': %s", w->partial_, std::strerror(errno)));
  }
  // Room for the whole file now, so a full disk is said before any work is spent on it.
  if (const int e = ::posix_fallocate(::fileno(w->file_), 0, static_cast<off_t>(w->Bytes()));
      e == ENOSPC || e == EFBIG) {
    return absl::ResourceExhaustedError(absl::StrFormat("no room on the disk for '%s' (%d bytes)", path, w->Bytes()));
  }
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header.size() >> (8 * i));
  if (std::fwrite(length, 1, 8, w->file_) != 8 || std::fwrite(header.data(), 1, header.size(), w->file_) != header.size()) {
    return absl::ResourceExhaustedError(absl::StrFormat("writing '%s': %s", w->partial_, std::strerror(errno)));
  }
  return w;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) {  // not finished: nothing is left behind
    std::fclose(file_);
    ::unlink(partial_.c_str());
  }
}

absl::Status SafetensorsWriter::Write(const void* bytes, uint64_t n) {
  if (written_ + n > data_bytes_) {
    return absl::InternalError(absl::StrFormat("'%s': %d bytes written past the %d the header announced", path_,
                                               written_ + n, data_bytes_));
  }
  if (std::fwrite(bytes, 1, n, file_) != n) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("writing '%s' (byte %d of %d): %s", partial_, written_, data_bytes_, std::strerror(errno)));
  }
  written_ += n;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (written_ != data_bytes_) {
    return absl::InternalError(
        absl::StrFormat("'%s': %d bytes written of the %d the header announced", path_, written_, data_bytes_));
  }
  const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const int error = errno;
  std::fclose(file_);
  file_ = nullptr;
  if (!flushed || ::rename(partial_.c_str(), path_.c_str()) != 0) {
    ::unlink(partial_.c_str());
    return absl::ResourceExhaustedError(absl::StrFormat("finishing '%s': %s", path_, std::strerror(flushed ? errno : error)));
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer::hf
