// The host's optimizer steps for Python (tierd.torch.OffloadOptimizer): the reference
// trainer's own vectorised AdamW, 8-bit AdamW and Lion (trainer_ref/host_*.h), so a step
// here gives the bits the C++ trainer's host step gives; and the gradient accumulation that
// feeds them, with each gradient's sum of squares for clipping by global norm.
//
// Arrays cross as addresses (torch's data_ptr()) and element counts: the caller (tierd.torch)
// owns the host tensors, keeps them alive across the call and checks their sizes and dtypes.
// Each call releases the GIL and splits its work over the host's threads (0: CpuThreads(),
// TIERD_CPU_THREADS); results do not depend on the count.
#include <pybind11/pybind11.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "python/bindings.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/host_lion.h"
#include "trainer_ref/parallel.h"

namespace tierd::python {
namespace py = pybind11;

namespace {

// Sums of squares over blocks of this many values, added in block order: the same double
// whatever the thread count.
constexpr int64_t kSumBlock = 1 << 16;

template <typename T>
T* Pointer(uintptr_t address, const char* what) {
  if (address == 0) ThrowStatus(absl::InvalidArgumentError(std::string(what) + " is a null pointer"));
  return reinterpret_cast<T*>(address);
}

void CheckCount(int64_t n) {
  if (n < 0) ThrowStatus(absl::InvalidArgumentError("a negative element count"));
}

// dst = (overwrite ? 0 : dst) + src, as fp32; returns the sum of squares of the new dst.
template <typename Src, typename Convert>
double AccumulateInto(float* dst, const Src* src, int64_t n, bool overwrite, int threads, Convert convert) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> sums(static_cast<size_t>(blocks), 0.0);
  trainer::ParallelFor(
      blocks, static_cast<double>(n),
      [&](int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          const int64_t begin = b * kSumBlock, end = std::min(n, begin + kSumBlock);
          double sum = 0;
          for (int64_t i = begin; i < end; ++i) {
            const float value = overwrite ? convert(src[i]) : dst[i] + convert(src[i]);
            dst[i] = value;
            sum += static_cast<double>(value) * value;
          }
          sums[static_cast<size_t>(b)] = sum;
        }
      },
      threads);
  double total = 0;
  for (double s : sums) total += s;
  return total;
}

// Runs step(offset, count, fp32 gradients) over n values in chunks, each chunk's bf16 gradients
// widened into a buffer of its thread's first (exact: a bf16 is an fp32's upper half), the chunks
// split over the threads. The steps go element by element, so the bits are those of one step over
// the whole widened array, without the fp32 copy's pass through memory.
constexpr int64_t kGradChunk = 1 << 14;
template <typename Step>
void OverBf16Grads(const uint16_t* grads, int64_t n, int threads, Step step) {
  const int64_t chunks = (n + kGradChunk - 1) / kGradChunk;
  trainer::ParallelFor(
      chunks, static_cast<double>(n),
      [&](int64_t first, int64_t last) {
        std::vector<float> wide(static_cast<size_t>(kGradChunk));
        for (int64_t c = first; c < last; ++c) {
          const int64_t begin = c * kGradChunk, count = std::min(kGradChunk, n - begin);
          for (int64_t i = 0; i < count; ++i) wide[static_cast<size_t>(i)] = trainer::Bf16Float(grads[begin + i]);
          step(begin, count, wide.data());
        }
      },
      threads);
}

bool Bf16Grads(const std::string& dtype) {
  if (dtype != "f32" && dtype != "bf16") ThrowStatus(absl::InvalidArgumentError("gradients are f32 or bf16, not " + dtype));
  return dtype == "bf16";
}

trainer::HostAdamWParams AdamWParams(float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                                     float grad_scale, bool decay) {
  if (step < 1) ThrowStatus(absl::InvalidArgumentError("the step counts from 1 (bias correction)"));
  return {.lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .weight_decay = weight_decay, .step = step,
          .grad_scale = grad_scale, .decay = decay};
}

}  // namespace

void AddHostOptimizers(py::module_& m) {
  m.def("cpu_threads", &trainer::CpuThreads, "threads the host steps use (TIERD_CPU_THREADS, else the cores, <= 16)");
  m.def(
      "accumulate",
      [](uintptr_t dst, uintptr_t src, const std::string& src_dtype, int64_t n, bool overwrite, int threads) {
        CheckCount(n);
        float* out = Pointer<float>(dst, "the accumulator");
        py::gil_scoped_release unlocked;
        if (src_dtype == "f32") {
          return AccumulateInto(out, Pointer<const float>(src, "the gradient"), n, overwrite, threads,
                                [](float x) { return x; });
        }
        if (src_dtype == "bf16") {
          // A lambda, not the function's address: the conversion inlines and the loop vectorises
          // (through a function pointer it ran 7x slower than the fp32 loop).
          return AccumulateInto(out, Pointer<const uint16_t>(src, "the gradient"), n, overwrite, threads,
                                [](uint16_t bits) { return trainer::Bf16Float(bits); });
        }
        ThrowStatus(absl::InvalidArgumentError("gradients are f32 or bf16, not " + src_dtype));
      },
      py::arg("dst"), py::arg("src"), py::arg("src_dtype"), py::arg("n"), py::arg("overwrite"), py::arg("threads") = 0,
      "dst (fp32) = src, or += src when not overwrite; returns the sum of squares of the new dst (float64)");
  m.def(
      "adamw",
      [](uintptr_t master, uintptr_t m1, uintptr_t v, uintptr_t weights_bf16, uintptr_t grads, int64_t n, float lr,
         float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale, bool decay,
         int threads, const std::string& grads_dtype) {
        CheckCount(n);
        const auto p = AdamWParams(lr, beta1, beta2, eps, weight_decay, step, grad_scale, decay);
        float *w = Pointer<float>(master, "master"), *mm = Pointer<float>(m1, "m"), *vv = Pointer<float>(v, "v");
        auto* out = reinterpret_cast<uint16_t*>(weights_bf16);
        if (Bf16Grads(grads_dtype)) {
          const uint16_t* g = Pointer<const uint16_t>(grads, "grads");
          py::gil_scoped_release unlocked;
          OverBf16Grads(g, n, threads, [&](int64_t at, int64_t count, const float* wide) {
            trainer::HostAdamW(w + at, mm + at, vv + at, out != nullptr ? out + at : nullptr, wide, count, p, 1);
          });
          return;
        }
        const float* g = Pointer<const float>(grads, "grads");
        py::gil_scoped_release unlocked;
        trainer::HostAdamW(w, mm, vv, out, g, n, p, threads);
      },
      py::arg("master"), py::arg("m"), py::arg("v"), py::arg("weights_bf16"), py::arg("grads"), py::arg("n"),
      py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
      py::arg("grad_scale"), py::arg("decay"), py::arg("threads") = 0, py::arg("grads_dtype") = "f32",
      "AdamW (trainer_ref/host_adamw.h) on fp32 master, m, v in place from f32 or bf16 gradients; weights_bf16 (0: "
      "none) gets the new master rounded to bf16");
  m.def("moment8bit_bytes", [](uint64_t n) { return trainer::Moment8bitBytes(n); },
        "bytes of one 8-bit moment of n values (codes and block scales)");
  m.def(
      "adamw8bit",
      [](uintptr_t master, uintptr_t m_bytes, uintptr_t v_bytes, uintptr_t weights_bf16, uintptr_t grads, int64_t n,
         float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step, float grad_scale, bool decay,
         int threads, const std::string& grads_dtype) {
        CheckCount(n);
        const auto p = AdamWParams(lr, beta1, beta2, eps, weight_decay, step, grad_scale, decay);
        float* w = Pointer<float>(master, "master");
        void *mm = Pointer<void>(m_bytes, "m"), *vv = Pointer<void>(v_bytes, "v");
        auto* out = reinterpret_cast<uint16_t*>(weights_bf16);
        if (Bf16Grads(grads_dtype)) {
          const uint16_t* g = Pointer<const uint16_t>(grads, "grads");
          py::gil_scoped_release unlocked;
          trainer::HostAdamW8bitFromBf16(w, mm, vv, out, g, n, p, threads);
          return;
        }
        const float* g = Pointer<const float>(grads, "grads");
        py::gil_scoped_release unlocked;
        trainer::HostAdamW8bit(w, mm, vv, out, g, n, p, threads);
      },
      py::arg("master"), py::arg("m"), py::arg("v"), py::arg("weights_bf16"), py::arg("grads"), py::arg("n"),
      py::arg("lr"), py::arg("beta1"), py::arg("beta2"), py::arg("eps"), py::arg("weight_decay"), py::arg("step"),
      py::arg("grad_scale"), py::arg("decay"), py::arg("threads") = 0, py::arg("grads_dtype") = "f32",
      "AdamW with 8-bit blockwise moments (trainer_ref/adamw8bit.h), moments of moment8bit_bytes(n) bytes each "
      "(all-zero bytes: a zero moment), from f32 or bf16 gradients");
  m.def(
      "lion",
      [](uintptr_t master, uintptr_t m1, uintptr_t weights_bf16, uintptr_t grads, int64_t n, float lr, float beta1,
         float beta2, float weight_decay, float grad_scale, bool decay, int threads, const std::string& grads_dtype) {
        CheckCount(n);
        const trainer::HostLionParams p{.lr = lr, .beta1 = beta1, .beta2 = beta2, .weight_decay = weight_decay,
                                        .grad_scale = grad_scale, .decay = decay};
        float *w = Pointer<float>(master, "master"), *mm = Pointer<float>(m1, "m");
        auto* out = reinterpret_cast<uint16_t*>(weights_bf16);
        if (Bf16Grads(grads_dtype)) {
          const uint16_t* g = Pointer<const uint16_t>(grads, "grads");
          py::gil_scoped_release unlocked;
          OverBf16Grads(g, n, threads, [&](int64_t at, int64_t count, const float* wide) {
            trainer::HostLion(w + at, mm + at, wide, count, p, 1, out != nullptr ? out + at : nullptr);
          });
          return;
        }
        const float* g = Pointer<const float>(grads, "grads");
        py::gil_scoped_release unlocked;
        trainer::HostLion(w, mm, g, n, p, threads, out);
      },
      py::arg("master"), py::arg("m"), py::arg("weights_bf16"), py::arg("grads"), py::arg("n"), py::arg("lr"),
      py::arg("beta1"), py::arg("beta2"), py::arg("weight_decay"), py::arg("grad_scale"), py::arg("decay"),
      py::arg("threads") = 0, py::arg("grads_dtype") = "f32",
      "Lion (trainer_ref/host_lion.h) on fp32 master and m in place from f32 or bf16 gradients");
}

}  // namespace tierd::python
