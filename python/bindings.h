// What the `_tierd` extension's parts share: a failed absl::Status crosses into Python as
// tierd.TierdError (its code's name in `code`, its number in `status`, its words as the
// message), and each part adds its names to the module.
#ifndef TIERD_PYTHON_BINDINGS_H_
#define TIERD_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd::python {

class StatusError : public std::exception {
 public:
  explicit StatusError(absl::Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::string what_;
};

[[noreturn]] void ThrowStatus(const absl::Status& status);
void Check(const absl::Status& status);
template <typename T>
T Value(absl::StatusOr<T>&& value) {
  if (!value.ok()) ThrowStatus(value.status());
  return std::move(*value);
}

void AddClient(pybind11::module_& m);          // client_bindings.cc
void AddHostOptimizers(pybind11::module_& m);  // host_optimizer_bindings.cc
void AddGpuOptimizers(pybind11::module_& m);   // gpu_optimizer_bindings.cc

}  // namespace tierd::python

#endif  // TIERD_PYTHON_BINDINGS_H_
