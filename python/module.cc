// The `tierd._tierd` extension module: the client (client_bindings.cc), the host's optimizer
// steps (host_optimizer_bindings.cc) and the GPU's (gpu_optimizer_bindings.cc). Nothing here
// links against torch.
#include <pybind11/pybind11.h>

#include "python/bindings.h"

PYBIND11_MODULE(_tierd, m) {
  m.doc() = "tierd's client shim and its optimizers' steps (use the `tierd` package, not this module)";
  tierd::python::AddClient(m);
  tierd::python::AddHostOptimizers(m);
  tierd::python::AddGpuOptimizers(m);
}
