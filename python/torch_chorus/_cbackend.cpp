// The "chorus" c10d Backend as a C++ object over the Python engine (backend.py): torch 2.15 wraps the Work
// a Python Backend returns in a holder whose is_completed() is always false, and its Python
// trampoline costs a few microseconds per call. This class is what torch sees: it runs the common
// synchronous all_reduce itself (one contiguous CPU tensor, nothing queued: libchorus's
// ncclAllReduce through a pointer the engine hands over) and forwards every other call to the
// Python engine, whose Works it returns unwrapped. Built against the torch it runs with (build_cext.py);
// where it cannot be built or loaded the engine is registered directly, as before.
// ChorusWork is the Work of the engine's asynchronous calls (make_work): torch's future-wrapping Work
// does not raise a failed future's error from wait() and refuses a wait with a timeout.
//
// Who touches what: `fast_` (atomic) is written by the engine's threads whenever its queue state
// changes and read by the issuing thread here; `fn_`/`comm_` are set before the engine allows the
// fast path and cleared (fast_ first) before its communicator is destroyed.
#include <ATen/record_function.h>
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <torch/csrc/jit/python/pybind_utils.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace {

using c10d::Work;
using WorkPtr = c10::intrusive_ptr<Work>;
using AllReduceFn = int (*)(const void*, void*, size_t, int, int, void*, void*);

// ncclDataType_t and ncclRedOp_t values (nccl.h).
int nccl_type(at::ScalarType t) {
  switch (t) {
    case at::kChar: return 0;
    case at::kByte: return 1;
    case at::kInt: return 2;
    case at::kLong: return 4;
    case at::kHalf: return 6;
    case at::kFloat: return 7;
    case at::kDouble: return 8;
    case at::kBFloat16: return 9;
    default: return -1;  // bool (op mapping differs), complex, ...: the engine decides
  }
}

int nccl_op(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MAX: return 2;
    case c10d::ReduceOp::MIN: return 3;
    case c10d::ReduceOp::AVG: return 4;
    default: return -1;  // PREMUL_SUM, bitwise: the engine decides (or refuses)
  }
}

// Whether Python objects may still be released (the GIL taken): not once the interpreter finalises,
// when taking it from another thread would end that thread inside a destructor.
bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// The tensors a future's value holds (a list of tensors, or the Python object the engine set).
std::vector<at::Tensor> tensors_of(const c10::IValue& v) {
  if (v.isTensorList()) return v.toTensorVector();
  if (v.isPyObject()) {
    py::gil_scoped_acquire g;
    return v.toPyObjectHolder()->extractTensors();
  }
  return {};
}

// Completes (Work::finish) when the engine's future does: wait() raises its error and honours a timeout,
// is_completed() polls. The future's callback holds the Work weakly: a dropped Work is no cycle.
class ChorusWork : public Work {
 public:
  explicit ChorusWork(c10::intrusive_ptr<c10::ivalue::Future> fut) : fut_(std::move(fut)) {}

  static c10::intrusive_ptr<ChorusWork> make(const py::object& pyfut) {
    auto fut = pyfut.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
    auto w = c10::make_intrusive<ChorusWork>(fut);
    c10::weak_intrusive_ptr<ChorusWork> weak(w);
    fut->addCallback([weak](c10::ivalue::Future& f) {
      if (auto w = weak.lock()) w->finish(f.hasError() ? error_of(f) : nullptr);
    });
    return w;
  }

  // The engine fails a future by raising Chorus's message from a callback (_engine.py, _unwrap): wait()
  // raises that message as a DistBackendError, without torch's callback prefix.
  static std::exception_ptr error_of(c10::ivalue::Future& f) {
    std::string msg = f.tryRetrieveErrorMessage();
    for (const char* prefix : {"Got the following error when running the callback: ", "RuntimeError: "}) {
      if (msg.rfind(prefix, 0) == 0) msg.erase(0, std::char_traits<char>::length(prefix));
    }
    try {
      C10_THROW_ERROR(DistBackendError, msg);
    } catch (...) {
      return std::current_exception();
    }
  }

  bool wait(std::chrono::milliseconds timeout) override {
    std::optional<py::gil_scoped_release> nogil;  // the settler that completes it needs the GIL
    if (PyGILState_Check()) nogil.emplace();
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [this] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
      C10_THROW_ERROR(DistBackendError, "chorus: Work.wait: the operation did not complete within " +
                                            std::to_string(timeout.count()) + " ms (it goes on in the background)");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return fut_; }

  // The tensors the operation wrote, as the Work it replaced gave them (deprecated, still called).
  std::vector<at::Tensor> result() override {
    wait(kNoTimeout);
    return tensors_of(fut_->value());
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> fut_;
};

// The Work of a call on device tensors (device_ops.py's _DeviceWork, a Python Work): held here with its
// Python object, which a plain cast would let go (pybind then loses its overrides and torch's base
// wait() waits forever). Each method asks the object, under the GIL.
class HeldWork : public Work {
 public:
  explicit HeldWork(py::object obj) : obj_(std::move(obj)) {}
  ~HeldWork() override {
    if (python_alive()) {
      py::gil_scoped_acquire g;
      obj_ = py::object();
    } else {
      obj_.release();
    }
  }
  bool wait(std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire g;
    return obj_.attr("_wait_ms")(timeout.count()).cast<bool>();
  }
  bool isCompleted() override {
    py::gil_scoped_acquire g;
    return obj_.attr("is_completed")().cast<bool>();
  }
  bool isSuccess() const override {
    py::gil_scoped_acquire g;
    return obj_.attr("is_success")().cast<bool>();
  }
  void synchronize() override {
    py::gil_scoped_acquire g;
    obj_.attr("synchronize")();
  }
  void blockCurrentStream() override { synchronize(); }  // the current stream waits; the host does not
  std::exception_ptr exception() const override {
    py::gil_scoped_acquire g;
    py::object e = obj_.attr("exception")();
    if (e.is_none()) return nullptr;
    try {
      C10_THROW_ERROR(DistBackendError, py::str(e).cast<std::string>());
    } catch (...) {
      return std::current_exception();
    }
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire g;
    return obj_.attr("get_future")().cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }
  std::vector<at::Tensor> result() override { return tensors_of(getFuture()->value()); }

 private:
  py::object obj_;
};

// torch.profiler: every call is a record_function "chorus::<call>" carrying its tensors, so traces show
// it with its input shapes (record_shapes=True). The list is built only while a profiler listens.
void add_ivals(std::vector<c10::IValue>& v, const at::Tensor& t) { v.emplace_back(t); }
void add_ivals(std::vector<c10::IValue>& v, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) v.emplace_back(t);
}
void add_ivals(std::vector<c10::IValue>& v, const std::vector<std::vector<at::Tensor>>& tss) {
  for (const auto& ts : tss) add_ivals(v, ts);
}
template <typename T>
void add_ivals(std::vector<c10::IValue>&, const T&) {}
template <typename... A>
std::vector<c10::IValue> ivals(const A&... a) {
  std::vector<c10::IValue> v;
  (add_ivals(v, a), ...);
  return v;
}

class ChorusCBackend : public c10d::Backend {
 public:
  ChorusCBackend(py::object engine, int rank, int size) : Backend(rank, size), engine_(std::move(engine)) {}

  ~ChorusCBackend() override {
    if (python_alive()) {
      py::gil_scoped_acquire g;
      engine_ = py::object();
      held_type_ = py::object();
    } else {
      engine_.release();  // the interpreter is gone: nothing left to release it to
      held_type_.release();
    }
  }

  void set_fast(uintptr_t fn, uintptr_t comm, bool on) {
    if (!on) fast_.store(false, std::memory_order_release);
    fn_ = reinterpret_cast<AllReduceFn>(fn);
    comm_ = reinterpret_cast<void*>(comm);
    if (on) fast_.store(true, std::memory_order_release);
  }
  void set_allowed(bool on) { fast_.store(on && fn_ && comm_, std::memory_order_release); }
  void set_done_work(WorkPtr w) { done_ = std::move(w); }
  // The engine's Python Work class for device calls (device_ops._DeviceWork): held, not cast (HeldWork).
  void set_held_type(py::object type) { held_type_ = std::move(type); }

  const std::string getBackendName() const override { return "chorus"; }
  bool supportsCoalescing() const override { return true; }

  // Splitting and the monitored barrier are virtuals of recent torch's Backend; declared without
  // `override` so that a torch whose Backend lacks one still builds (then it is never called).
  // dist.split_group: the engine splits its communicator (ncclCommSplit) and puts the child behind a
  // front of its own; nullptr for a rank in no new group.
  bool supportsSplitting() const { return true; }
  // What splitGroup copies for the child (timeout, group name): the engine's (backend.py, `options`).
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() {
    py::gil_scoped_acquire g;
    return engine_.attr("options").cast<c10::intrusive_ptr<c10d::Backend::Options>>();
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
                                         const c10::intrusive_ptr<c10d::Backend::Options>& opts) {
    py::gil_scoped_acquire g;
    py::object child = engine_.attr("_split_front")(store, ranks, opts);
    if (child.is_none()) return nullptr;
    return child.cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  // dist.shrink_group (torch 2.10+): the engine shrinks its communicator (ncclCommShrink) and puts the
  // survivors behind a front of their own.
  bool supportsShrinking() const { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts_override = nullptr) {
    (void)opts_override;  // the survivors keep the group's settings (timeout, name)
    py::gil_scoped_acquire g;
    py::object child = engine_.attr("_shrink_front")(ranks_to_exclude, shrink_flags);
    return child.cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  // dist.monitored_barrier: through the group's store, naming the ranks that did not come (backend.py).
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) {
    py::gil_scoped_acquire g;
    engine_.attr("monitored_barrier")(opts, waitAllRanks);
  }

  WorkPtr allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    RECORD_FUNCTION("chorus::allreduce", ivals(tensors));
    if (!opts.asyncOp && tensors.size() == 1 && fast_.load(std::memory_order_acquire)) {
      at::Tensor& t = tensors[0];
      int dt = nccl_type(t.scalar_type()), op = nccl_op(opts.reduceOp.op_);
      if (dt >= 0 && op >= 0 && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous()) {
        void* p = t.data_ptr();
        int rc = fn_(p, p, static_cast<size_t>(t.numel()), dt, op, comm_, nullptr);
        if (rc == 0) return done_;
        py::gil_scoped_acquire g;
        engine_.attr("_check")(rc, "allreduce");  // raises with Chorus's message
      }
    }
    return invoke("allreduce", tensors, opts);
  }

  WorkPtr allreduce_coalesced(std::vector<at::Tensor>& t, const c10d::AllreduceCoalescedOptions& o) override {
    return call("allreduce_coalesced", t, o);
  }
  WorkPtr broadcast(std::vector<at::Tensor>& t, const c10d::BroadcastOptions& o) override { return call("broadcast", t, o); }
  WorkPtr reduce(std::vector<at::Tensor>& t, const c10d::ReduceOptions& o) override { return call("reduce", t, o); }
  WorkPtr allgather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                    const c10d::AllgatherOptions& o) override {
    return call("allgather", out, in, o);
  }
  WorkPtr _allgather_base(at::Tensor& out, at::Tensor& in, const c10d::AllgatherOptions& o) override {
    return call("_allgather_base", out, in, o);
  }
  WorkPtr allgather_coalesced(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                              const c10d::AllgatherOptions& o) override {
    return call("allgather_coalesced", out, in, o);
  }
  WorkPtr allgather_into_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllgatherOptions& o) override {
    return call("allgather_into_tensor_coalesced", out, in, o);
  }
  WorkPtr gather(std::vector<std::vector<at::Tensor>>& out, std::vector<at::Tensor>& in,
                 const c10d::GatherOptions& o) override {
    return call("gather", out, in, o);
  }
  WorkPtr scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                  const c10d::ScatterOptions& o) override {
    return call("scatter", out, in, o);
  }
  WorkPtr reduce_scatter(std::vector<at::Tensor>& out, std::vector<std::vector<at::Tensor>>& in,
                         const c10d::ReduceScatterOptions& o) override {
    return call("reduce_scatter", out, in, o);
  }
  WorkPtr _reduce_scatter_base(at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o) override {
    return call("_reduce_scatter_base", out, in, o);
  }
  WorkPtr reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::ReduceScatterOptions& o) override {
    return call("reduce_scatter_tensor_coalesced", out, in, o);
  }
  WorkPtr alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                        std::vector<int64_t>& in_splits, const c10d::AllToAllOptions& o) override {
    return call("alltoall_base", out, in, out_splits, in_splits, o);
  }
  WorkPtr alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in, const c10d::AllToAllOptions& o) override {
    return call("alltoall", out, in, o);
  }
  WorkPtr barrier(const c10d::BarrierOptions& o) override { return call("barrier", o); }
  WorkPtr send(std::vector<at::Tensor>& t, int dst, int tag) override { return call("send", t, dst, tag); }
  WorkPtr recv(std::vector<at::Tensor>& t, int src, int tag) override { return call("recv", t, src, tag); }
  WorkPtr recvAnysource(std::vector<at::Tensor>& t, int tag) override { return call("recv_anysource", t, tag); }

  void startCoalescing() override {
    py::gil_scoped_acquire g;
    engine_.attr("start_coalescing")();
  }
  WorkPtr endCoalescing() override { return call("end_coalescing"); }
  void shutdown() override {
    py::gil_scoped_acquire g;
    engine_.attr("shutdown")();
  }
  void abort() override {
    py::gil_scoped_acquire g;
    engine_.attr("abort")();
  }

  py::object engine() const { return engine_; }

 private:
  template <typename... A>
  WorkPtr call(const char* name, A&... args) {
    RECORD_FUNCTION(std::string("chorus::") + name, ivals(args...));
    return invoke(name, args...);
  }
  template <typename... A>
  WorkPtr invoke(const char* name, A&... args) {
    py::gil_scoped_acquire g;
    py::object w = engine_.attr(name)(args...);
    if (held_type_ && py::isinstance(w, held_type_)) return c10::make_intrusive<HeldWork>(std::move(w));
    return w.template cast<WorkPtr>();
  }

  py::object engine_;
  py::object held_type_;
  std::atomic<bool> fast_{false};
  AllReduceFn fn_ = nullptr;
  void* comm_ = nullptr;
  WorkPtr done_;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::module_::import("torch._C._distributed_c10d");  // registers c10d's Backend and Work with pybind
  py::class_<ChorusCBackend, c10d::Backend, c10::intrusive_ptr<ChorusCBackend>>(m, "ChorusCBackend")
      .def(py::init<py::object, int, int>())
      .def("set_fast", &ChorusCBackend::set_fast)
      .def("set_allowed", &ChorusCBackend::set_allowed)
      .def("set_done_work", &ChorusCBackend::set_done_work)
      .def("set_held_type", &ChorusCBackend::set_held_type)
      .def_property_readonly("engine", &ChorusCBackend::engine)
      // What torch's Python asks of a backend that supports splitting (new_group's ranks outside a new
      // group, group descriptions): the engine's answers.
      .def("perform_nocolor_split", [](ChorusCBackend& b, py::object device) {
        b.engine().attr("perform_nocolor_split")(device);
      }, py::arg("device") = py::none())
      .def("comm_split_count", [](ChorusCBackend& b) { return b.engine().attr("comm_split_count")(); });
  py::class_<ChorusWork, Work, c10::intrusive_ptr<ChorusWork>>(m, "ChorusWork");
  m.def("make_work", &ChorusWork::make);
  m.attr("TORCH_VERSION") = py::str(CHORUS_TORCH_VERSION);  // the torch it was built against
}
