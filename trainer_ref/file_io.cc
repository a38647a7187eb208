#include "trainer_ref/file_io.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_format.h"

namespace tierd::trainer {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
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

absl::Status WriteFileAside(const std::string& path, std::string_view bytes) {
  const std::string partial = path + ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(absl::StrFormat("cannot create '%s': %s", partial, std::strerror(errno)));
  }
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size() && std::fflush(f) == 0 &&
                       ::fsync(::fileno(f)) == 0;
  const int error = errno;
  const bool closed = std::fclose(f) == 0;
  if (!written || !closed || std::rename(partial.c_str(), path.c_str()) != 0) {
    std::remove(partial.c_str());
    return absl::ResourceExhaustedError(
        absl::StrFormat("writing '%s' failed (%s; disk full?): nothing of it is left", path, std::strerror(error)));
  }
  return absl::OkStatus();
}

}  // namespace tierd::trainer
