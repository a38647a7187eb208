// The DLPack ABI (dmlc/dlpack, v0.8 layout: the unversioned DLManagedTensor that every
// torch 2.x, NumPy >= 1.22, CuPy and JAX consume), written from its specification: the
// structs a producer hands over in a PyCapsule named "dltensor".
#ifndef TIERD_PYTHON_DLPACK_H_
#define TIERD_PYTHON_DLPACK_H_

#include <cstdint>

namespace tierd::python {

enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2 };
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };

struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};

struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // null: compact row-major
  uint64_t byte_offset;
};

struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

}  // namespace tierd::python

#endif  // TIERD_PYTHON_DLPACK_H_
