// The reference trainer's GPU optimizer steps for Python: tierd.torch.OffloadOptimizer's share
// of parameters stepped on the GPU (gpu_share=) runs trainer_ref/kernels' AdamW, 8-bit AdamW and
// Lion, whose arithmetic is the host steps' operation for operation (tested against them on the
// GPU), so where a parameter is stepped changes none of its bits.
//
// Arrays cross as device addresses (tierd's GPU leases, torch's data_ptr()), the work is queued
// on the caller's CUDA stream (torch.cuda.Stream.cuda_stream) and nothing is waited for. Built
// without a CUDA toolkit the module says has_cuda = False and a step is an error.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "python/bindings.h"

#ifdef TIERD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "trainer_ref/kernels/gpu_ops.h"
#endif

namespace tierd::python {
namespace py = pybind11;

namespace {

#ifdef TIERD_HAVE_CUDA
template <typename T>
T* DevicePointer(uintptr_t address, const char* what) {
  if (address == 0) ThrowStatus(absl::InvalidArgumentError(std::string(what) + " is a null pointer"));
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, reinterpret_cast<void*>(address)) != cudaSuccess ||
      attributes.type != cudaMemoryTypeDevice) {
    (void)cudaGetLastError();
    ThrowStatus(absl::InvalidArgumentError(std::string(what) + " is not in GPU memory: the GPU step reads and "
                                           "writes device arrays only (the host's steps take host arrays)"));
  }
  return reinterpret_cast<T*>(address);
}

template <typename G>
cudaError_t Launch(const std::string& opt, float* master, void* m, void* v, trainer::gpu::Bf16* weights,
                   const G* grads, int64_t n, const trainer::gpu::AdamWParams& p, cudaStream_t stream) {
  namespace gpu = trainer::gpu;
  if (opt == "adamw") {
    gpu::AdamW(master, static_cast<float*>(m), static_cast<float*>(v), weights, grads, n, p, stream);
    return cudaGetLastError();
  }
  if (opt == "adamw8bit") return gpu::AdamW8bit(master, m, v, weights, grads, n, p, stream);
  gpu::Lion(master, static_cast<float*>(m), weights, grads, n, p, stream);
  return cudaGetLastError();
}
#endif

}  // namespace

void AddGpuOptimizers(py::module_& m) {
#ifdef TIERD_HAVE_CUDA
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  m.def(
      "gpu_step",
      [](const std::string& opt, uintptr_t master, uintptr_t m1, uintptr_t v, uintptr_t weights_bf16, uintptr_t grads,
         int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale,
         bool decay, const std::string& grads_dtype, uintptr_t cuda_stream) {
        if (opt != "adamw" && opt != "adamw8bit" && opt != "lion") {
          ThrowStatus(absl::InvalidArgumentError("the GPU steps are adamw, adamw8bit and lion, not " + opt));
        }
        if (grads_dtype != "f32" && grads_dtype != "bf16") {
          ThrowStatus(absl::InvalidArgumentError("gradients are f32 or bf16, not " + grads_dtype));
        }
        if (n < 0) ThrowStatus(absl::InvalidArgumentError("a negative element count"));
        if (step < 1) ThrowStatus(absl::InvalidArgumentError("the step counts from 1 (bias correction)"));
#ifdef TIERD_HAVE_CUDA
        if (n == 0) return;
        const trainer::gpu::AdamWParams p{.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                                          .weight_decay = weight_decay, .step = step, .grad_scale = grad_scale,
                                          .decay = decay};
        float* w = DevicePointer<float>(master, "master");
        void* mm = DevicePointer<void>(m1, "m");
        void* vv = opt == "lion" ? nullptr : DevicePointer<void>(v, "v");
        auto* out = weights_bf16 == 0 ? nullptr : DevicePointer<trainer::gpu::Bf16>(weights_bf16, "weights_bf16");
        auto stream = reinterpret_cast<cudaStream_t>(cuda_stream);
        const cudaError_t launched =
            grads_dtype == "bf16"
                ? Launch(opt, w, mm, vv, out, DevicePointer<const trainer::gpu::Bf16>(grads, "grads"), n, p, stream)
                : Launch(opt, w, mm, vv, out, DevicePointer<const float>(grads, "grads"), n, p, stream);
        if (launched != cudaSuccess) {
          ThrowStatus(absl::InternalError("queueing the GPU " + opt + " step of " + std::to_string(n) +
                                          " values failed: " + cudaGetErrorString(launched)));
        }
#else
        (void)master, (void)m1, (void)v, (void)weights_bf16, (void)grads, (void)lr, (void)beta1, (void)beta2,
            (void)eps, (void)weight_decay, (void)grad_scale, (void)decay, (void)cuda_stream;
        ThrowStatus(absl::FailedPreconditionError(
            "this tierd extension was built without a CUDA toolkit: it cannot step parameters on a GPU"));
#endif
      },
      py::arg("opt"), py::arg("master"), py::arg("m"), py::arg("v"), py::arg("weights_bf16"), py::arg("grads"),
      py::arg("n"), py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"),
      py::arg("step"), py::arg("grad_scale"), py::arg("decay"), py::arg("grads_dtype"), py::arg("cuda_stream"),
      "AdamW, 8-bit AdamW or Lion (v unused) on device arrays, queued on cuda_stream: the host step's bits; "
      "weights_bf16 (0: none) gets the new master rounded to bf16");
}

}  // namespace tierd::python
