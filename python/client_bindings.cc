// tierd::Client for Python (the `tierd` package's `_tierd.Client`): the same contract as the
// C++ shim (clients/client.h) and the same errors, raised as tierd.TierdError with the
// status's code. An acquired tensor comes back as a View: its bytes where they were put
// (host or GPU), valid until the tensor is released, handed to torch (or NumPy, CuPy) through
// DLPack without a copy and without linking any of them, and to plain Python through the
// buffer protocol when it is in host memory.
//
// The GIL is released while a call waits on tierd (connect, acquire, release, the gRPC calls),
// so other Python threads run meanwhile. One Client may be used from several threads, as the
// C++ one; a tensor's acquire and release are expected from one owner.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "clients/client.h"
#include "google/protobuf/util/json_util.h"
#include "python/bindings.h"
#include "python/dlpack.h"

namespace tierd::python {
namespace py = pybind11;

namespace {

PyObject* tierd_error = nullptr;  // tierd.TierdError, made at import

// A lease's identity as Python sees it.
struct PyTensor {
  Client::Tensor tensor;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
};

// An acquired tensor's bytes. Holds no ownership: Release ends its validity, as in C++.
struct View {
  void* data = nullptr;
  uint64_t bytes = 0;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
  bool on_gpu = false;  // device memory (a real GPU), else host memory
  std::string name;
};

DLDataType DlTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF32: return {kDLFloat, 32, 1};
    case DType::kBF16: return {kDLBfloat, 16, 1};
    case DType::kF16: return {kDLFloat, 16, 1};
    case DType::kI32: return {kDLInt, 32, 1};
    case DType::kI64: return {kDLInt, 64, 1};
    case DType::kF8E4M3:  // FP8 crosses as its bytes: DLPack's FP8 codes are not read by every torch 2.x
    case DType::kF8E5M2:
    case DType::kU8: return {kDLUInt, 8, 1};
  }
  return {kDLUInt, 8, 1};
}

// The DLManagedTensor and the shape it points at, freed by its deleter.
struct Managed {
  DLManagedTensor managed;
  std::vector<int64_t> shape;
};

void DeleteManaged(DLManagedTensor* self) { delete static_cast<Managed*>(self->manager_ctx); }

// A capsule nobody consumed (renamed "used_dltensor" by a consumer) still owns its tensor.
void CapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
}

py::capsule ToDlpack(const View& view) {
  auto* owner = new Managed;
  owner->shape = view.shape;
  DLTensor& t = owner->managed.dl_tensor;
  t.data = view.data;
  t.device = {view.on_gpu ? kDLCUDA : kDLCPU, 0};
  t.ndim = static_cast<int32_t>(owner->shape.size());
  t.dtype = DlTypeOf(view.dtype);
  t.shape = owner->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  owner->managed.manager_ctx = owner;
  owner->managed.deleter = DeleteManaged;
  PyObject* capsule = PyCapsule_New(&owner->managed, "dltensor", CapsuleDestructor);
  if (capsule == nullptr) {
    delete owner;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

Access ParseAccess(const std::string& access) {
  if (access == "read") return Access::kRead;
  if (access == "write") return Access::kWrite;
  if (access == "overwrite") return Access::kOverwrite;
  ThrowStatus(absl::InvalidArgumentError("access is read, write or overwrite, not '" + access + "'"));
}

Place ParsePlace(const std::string& place) {
  if (place == "gpu") return Place::kGpu;
  if (place == "host") return Place::kHost;
  ThrowStatus(absl::InvalidArgumentError("place is gpu or host, not '" + place + "'"));
}

Tier ParseTier(const std::string& tier) {
  for (Tier t : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
    if (tier == TierName(t)) return t;
  }
  ThrowStatus(absl::InvalidArgumentError("tier is gpu, dram or nvme, not '" + tier + "'"));
}

std::string Json(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) {
    ThrowStatus(absl::InternalError("a reply could not be written as JSON"));
  }
  return out;
}

// The client, closed by close() or when collected (the session ends; tierd reclaims its leases).
class PyClient {
 public:
  PyClient(const std::string& runtime_dir, const std::string& label, uint64_t gpu_bytes, uint64_t dram_bytes,
           uint64_t nvme_bytes, bool use_ring, int rings) {
    ClientOptions options{.runtime_dir = runtime_dir,
                          .label = label,
                          .quota = {gpu_bytes, dram_bytes, nvme_bytes},
                          .use_ring = use_ring,
                          .rings = rings};
    absl::StatusOr<std::unique_ptr<Client>> client;
    {
      py::gil_scoped_release unlocked;
      client = Client::Connect(options);
    }
    client_ = Value(std::move(client));
  }

  PyTensor Lease(const std::string& name, const std::string& tensor_class, const std::string& dtype,
                 const std::vector<int64_t>& shape) {
    TensorSpec spec{.name = name, .tensor_class = Value(ParseTensorClass(tensor_class)),
                    .dtype = Value(ParseDType(dtype)), .shape = shape};
    absl::StatusOr<Client::Tensor> tensor;
    {
      py::gil_scoped_release unlocked;
      tensor = Open().Lease(spec);
    }
    return PyTensor{Value(std::move(tensor)), spec.dtype, shape};
  }

  void Unlease(const PyTensor& t) { Check(Open().Unlease(t.tensor)); }

  View Acquire(const PyTensor& t, const std::string& access, const std::string& place) {
    const Place where = ParsePlace(place);
    const Access how = ParseAccess(access);
    absl::StatusOr<void*> pointer;
    {
      py::gil_scoped_release unlocked;
      pointer = Open().Acquire(t.tensor, how, where);
    }
    return View{Value(std::move(pointer)), t.tensor.bytes, t.dtype, t.shape,
                where == Place::kGpu && !client_->fake_gpu(), t.tensor.name};
  }

  // Several in one exchange with tierd (Client::AcquireAll): all or none.
  std::vector<View> AcquireAll(const std::vector<PyTensor>& tensors, const std::vector<std::string>& accesses,
                               const std::string& place) {
    if (accesses.size() != tensors.size()) {
      ThrowStatus(absl::InvalidArgumentError(absl::StrFormat("acquire_all: %d tensors but %d accesses", tensors.size(),
                                                             accesses.size())));
    }
    const Place where = ParsePlace(place);
    std::vector<Client::AcquireItem> items;
    items.reserve(tensors.size());
    for (size_t k = 0; k < tensors.size(); ++k) items.push_back({&tensors[k].tensor, ParseAccess(accesses[k])});
    absl::StatusOr<std::vector<void*>> pointers;
    {
      py::gil_scoped_release unlocked;
      pointers = Open().AcquireAll(items, where);
    }
    std::vector<void*> got = Value(std::move(pointers));
    std::vector<View> views;
    views.reserve(got.size());
    for (size_t k = 0; k < got.size(); ++k) {
      const PyTensor& t = tensors[k];
      views.push_back(View{got[k], t.tensor.bytes, t.dtype, t.shape, where == Place::kGpu && !client_->fake_gpu(),
                           t.tensor.name});
    }
    return views;
  }

  // cuda_stream: a cudaStream_t as an integer (torch.cuda.Stream.cuda_stream), after whose queued
  // work tierd may move the bytes; 0 is CUDA's legacy default stream (torch's default stream), a
  // stream like any other. None: now.
  void ReleaseAll(const std::vector<PyTensor>& tensors, std::optional<uintptr_t> cuda_stream) {
    std::vector<const Client::Tensor*> all;
    all.reserve(tensors.size());
    for (const PyTensor& t : tensors) all.push_back(&t.tensor);
    absl::Status status;
    {
      py::gil_scoped_release unlocked;
      status = cuda_stream.has_value() ? Open().ReleaseAll(all, reinterpret_cast<void*>(*cuda_stream))
                                       : Open().ReleaseAll(all);
    }
    Check(status);
  }

  void Release(const PyTensor& t, std::optional<uintptr_t> cuda_stream) {
    absl::Status status;
    {
      py::gil_scoped_release unlocked;
      status = cuda_stream.has_value() ? Open().Release(t.tensor, reinterpret_cast<void*>(*cuda_stream))
                                       : Open().Release(t.tensor);
    }
    Check(status);
  }

  void Pin(const PyTensor& t, const std::string& tier) { Check(Open().Pin(t.tensor, ParseTier(tier))); }
  void Unpin(const PyTensor& t) { Check(Open().Unpin(t.tensor)); }

  std::string MarkIteration() {
    absl::StatusOr<v1::PlanReply> reply;
    {
      py::gil_scoped_release unlocked;
      reply = Open().MarkIteration();
    }
    return Json(Value(std::move(reply)));
  }

  // The iteration's graph as GraphSpec's JSON (proto/tierd.proto), the plan's prediction back.
  std::string RegisterGraph(const std::string& graph_json) {
    v1::GraphSpec graph;
    if (const auto parsed = google::protobuf::util::JsonStringToMessage(graph_json, &graph); !parsed.ok()) {
      ThrowStatus(absl::InvalidArgumentError("the graph is not GraphSpec's JSON: " + parsed.ToString()));
    }
    absl::StatusOr<v1::PlanReply> reply;
    {
      py::gil_scoped_release unlocked;
      reply = Open().RegisterGraph(graph);
    }
    return Json(Value(std::move(reply)));
  }

  void OpBegin(uint32_t op) {
    absl::Status status;
    {
      py::gil_scoped_release unlocked;
      status = Open().OpBegin(op);
    }
    Check(status);
  }

  void ReportStep(int64_t step, double loss, double seconds, double tokens) {
    Check(Open().ReportStep(step, loss, seconds, tokens));
  }

  std::string Stats() {
    absl::StatusOr<v1::StatsReply> reply;
    {
      py::gil_scoped_release unlocked;
      reply = Open().Stats();
    }
    return Json(Value(std::move(reply)));
  }

  std::string Usage(bool reset_peaks) {
    absl::StatusOr<v1::SessionUsageReply> reply;
    {
      py::gil_scoped_release unlocked;
      reply = Open().Usage(reset_peaks);
    }
    return Json(Value(std::move(reply)));
  }

  std::string Leases(bool every_session) {
    absl::StatusOr<v1::ListLeasesReply> reply;
    {
      py::gil_scoped_release unlocked;
      reply = Open().ListLeases(every_session);
    }
    return Json(Value(std::move(reply)));
  }

  py::dict RingTimes() {
    const Client::RingTimes t = Open().ring_times();
    py::dict d;
    d["acquires"] = t.acquires;
    d["releases"] = t.releases;
    d["acquire_seconds"] = t.acquire_seconds;
    d["release_seconds"] = t.release_seconds;
    return d;
  }

  bool SessionOpen() { return client_ != nullptr && client_->SessionOpen(); }
  bool FakeGpu() { return Open().fake_gpu(); }
  py::tuple DramArena() {
    const auto [base, bytes] = Open().dram_arena();
    return py::make_tuple(reinterpret_cast<uintptr_t>(base), bytes);
  }
  uint64_t SessionId() { return Open().session_id(); }
  void Close() {
    py::gil_scoped_release unlocked;
    client_.reset();
  }

 private:
  Client& Open() {
    if (client_ == nullptr) ThrowStatus(absl::FailedPreconditionError("this tierd client was closed"));
    return *client_;
  }
  std::unique_ptr<Client> client_;
};

}  // namespace

[[noreturn]] void ThrowStatus(const absl::Status& status) { throw StatusError(status); }

void Check(const absl::Status& status) {
  if (!status.ok()) ThrowStatus(status);
}

void AddClient(py::module_& m) {
  tierd_error = PyErr_NewExceptionWithDoc(
      "tierd._tierd.TierdError",
      "A call to tierd failed. `code` is the status's name (UNAVAILABLE: tierd is gone or ended the session; "
      "RESOURCE_EXHAUSTED: a quota or a tier is full; INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION...), "
      "`status` its number (the gRPC code); the message says why in words.",
      PyExc_RuntimeError, nullptr);
  m.add_object("TierdError", py::handle(tierd_error));
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const absl::Status& s = e.status();
      py::object error = py::reinterpret_borrow<py::object>(tierd_error)(std::string(s.message()));
      error.attr("code") = absl::StatusCodeToString(s.code());
      error.attr("status") = static_cast<int>(s.code());
      PyErr_SetObject(tierd_error, error.ptr());
    }
  });

  py::class_<PyTensor>(m, "Tensor", "A lease: the tensor's name, id, bytes, dtype and shape.")
      .def_property_readonly("name", [](const PyTensor& t) { return t.tensor.name; })
      .def_property_readonly("id", [](const PyTensor& t) { return t.tensor.id; })
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.tensor.bytes; })
      .def_property_readonly("dtype", [](const PyTensor& t) { return std::string(DTypeName(t.dtype)); })
      .def_property_readonly("shape", [](const PyTensor& t) { return py::tuple(py::cast(t.shape)); })
      .def("__repr__", [](const PyTensor& t) {
        return absl::StrFormat("<tierd.Tensor %s %s, %d bytes>", t.tensor.name, DTypeName(t.dtype), t.tensor.bytes);
      });

  py::class_<View>(m, "View", py::buffer_protocol(),
                   "An acquired tensor's bytes, valid until its release: torch.from_dlpack(view) (no copy), or "
                   "memoryview(view) in host memory.")
      .def_property_readonly("data_ptr", [](const View& v) { return reinterpret_cast<uintptr_t>(v.data); })
      .def_property_readonly("nbytes", [](const View& v) { return v.bytes; })
      .def_property_readonly("on_gpu", [](const View& v) { return v.on_gpu; })
      .def_property_readonly("dtype", [](const View& v) { return std::string(DTypeName(v.dtype)); })
      .def_property_readonly("shape", [](const View& v) { return py::tuple(py::cast(v.shape)); })
      // stream, max_version, dl_device, copy: the bytes are in place when acquire returns (no
      // stream to order after), and the capsule is the unversioned one every torch 2.x reads.
      .def("__dlpack__", [](const View& v, const py::kwargs&) { return ToDlpack(v); })
      .def("__dlpack_device__",
           [](const View& v) { return py::make_tuple(v.on_gpu ? static_cast<int>(kDLCUDA) : static_cast<int>(kDLCPU), 0); })
      .def_buffer([](const View& v) -> py::buffer_info {
        if (v.on_gpu) ThrowStatus(absl::FailedPreconditionError(v.name + " is in GPU memory: use torch.from_dlpack"));
        return py::buffer_info(v.data, 1, "B", 1, {static_cast<py::ssize_t>(v.bytes)}, {1});
      });

  py::class_<PyClient>(m, "Client", "A session with tierd (clients/client.h), ended by close() or collection.")
      .def(py::init<const std::string&, const std::string&, uint64_t, uint64_t, uint64_t, bool, int>(),
           py::arg("runtime_dir") = "/tmp/tierd", py::arg("label") = "python", py::arg("gpu_bytes") = 0,
           py::arg("dram_bytes") = 0, py::arg("nvme_bytes") = 0, py::arg("use_ring") = true, py::arg("rings") = 4)
      .def("lease", &PyClient::Lease, py::arg("name"), py::arg("tensor_class"), py::arg("dtype"), py::arg("shape"))
      .def("unlease", &PyClient::Unlease)
      .def("acquire", &PyClient::Acquire, py::arg("tensor"), py::arg("access") = "read", py::arg("place") = "gpu")
      .def("release", &PyClient::Release, py::arg("tensor"), py::arg("cuda_stream") = py::none())
      .def("acquire_all", &PyClient::AcquireAll, py::arg("tensors"), py::arg("accesses"), py::arg("place") = "host")
      .def("release_all", &PyClient::ReleaseAll, py::arg("tensors"), py::arg("cuda_stream") = py::none())
      .def("pin", &PyClient::Pin)
      .def("unpin", &PyClient::Unpin)
      .def("mark_iteration", &PyClient::MarkIteration)
      .def("register_graph_json", &PyClient::RegisterGraph, py::arg("graph_json"))
      .def("op_begin", &PyClient::OpBegin, py::arg("op"))
      .def("report_step", &PyClient::ReportStep, py::arg("step"), py::arg("loss"), py::arg("seconds"),
           py::arg("tokens"))
      .def("stats_json", &PyClient::Stats)
      .def("usage_json", &PyClient::Usage, py::arg("reset_peaks") = false)
      .def("leases_json", &PyClient::Leases, py::arg("every_session") = false)
      .def("ring_times", &PyClient::RingTimes)
      .def("session_open", &PyClient::SessionOpen)
      .def_property_readonly("fake_gpu", &PyClient::FakeGpu)
      .def("dram_arena", &PyClient::DramArena,
           "(address, bytes) of this process's mapping of the session's DRAM arena, where every host pointer "
           "acquire returns lies, fixed while the client lives (e.g. for cudaHostRegister)")
      .def_property_readonly("session_id", &PyClient::SessionId)
      .def("close", &PyClient::Close);
}

}  // namespace tierd::python
