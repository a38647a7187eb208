// Small helpers of the GPU check: CUDA error checks that end the check with a message,
// hex for passing handles on the command line, line messages over pipes.
#ifndef TIERD_TOOLS_GPU_CHECK_CHECK_UTIL_H_
#define TIERD_TOOLS_GPU_CHECK_CHECK_UTIL_H_

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tierd::gpu_check {

#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    const cudaError_t check_error_ = (call);                                               \
    if (check_error_ != cudaSuccess) {                                                     \
      std::fprintf(stderr, "gpu_ipc_check: %s failed: %s (%s:%d)\n", #call,                \
                   cudaGetErrorString(check_error_), __FILE__, __LINE__);                  \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

inline std::string ToHex(const void* data, size_t bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < bytes; ++i) {
    const unsigned char byte = static_cast<const unsigned char*>(data)[i];
    out += digits[byte >> 4];
    out += digits[byte & 15];
  }
  return out;
}

inline bool FromHex(const std::string& hex, void* data, size_t bytes) {
  if (hex.size() != 2 * bytes) return false;
  for (size_t i = 0; i < bytes; ++i) {
    static_cast<unsigned char*>(data)[i] =
        static_cast<unsigned char>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

inline void SendLine(int fd, const std::string& line) {
  const std::string message = line + "\n";
  if (write(fd, message.data(), message.size()) != static_cast<ssize_t>(message.size())) {
    std::perror("gpu_ipc_check: write to pipe");
    std::exit(1);
  }
}

inline std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1) {
    if (c == '\n') return line;
    line += c;
  }
  std::fprintf(stderr, "gpu_ipc_check: the other process closed the pipe (read so far: '%s')\n",
               line.c_str());
  std::exit(1);
}

}  // namespace tierd::gpu_check

#endif  // TIERD_TOOLS_GPU_CHECK_CHECK_UTIL_H_
