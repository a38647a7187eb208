// CRC32C (Castagnoli), the checksum of NVMe pages: computed before a write, verified
// after the read. Uses the SSE4.2 crc32 instruction when the CPU has it (~8 GB/s a
// core, several times the NVMe link), a table otherwise.
#ifndef TIERD_BASE_CRC32C_H_
#define TIERD_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tierd {

// Extends `crc` (0 to start) over `bytes` bytes at `data`.
uint32_t Crc32c(uint32_t crc, const void* data, size_t bytes);

// The table implementation alone: the oracle in tests.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t bytes);

}  // namespace tierd

#endif  // TIERD_BASE_CRC32C_H_
