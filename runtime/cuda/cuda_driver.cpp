#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"

#include <dlfcn.h>

#include <cstdlib>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#ifdef OPTJIT_HAVE_CUDA_H
#include <cuda.h>

#include <type_traits>
#endif

namespace optjit {
namespace {

#ifdef OPTJIT_HAVE_CUDA_H
using CUresult = ::CUresult;
using CUdevice = ::CUdevice;
using CUcontext = ::CUcontext;
using CUdeviceptr = ::CUdeviceptr;
using CUstream = ::CUstream;
using CUmodule = ::CUmodule;
using CUfunction = ::CUfunction;
using CUevent = ::CUevent;
using CUgraph = ::CUgraph;
using CUgraphExec = ::CUgraphExec;
using CUjit_option = ::CUjit_option;
using CUdevice_attribute = ::CUdevice_attribute;
using CUfunction_attribute = ::CUfunction_attribute;
using CUstreamCaptureMode = ::CUstreamCaptureMode;
#else
// The driver's C types, as cuda.h declares them (enums are int-sized, handles are pointers).
using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUdeviceptr = unsigned long long;
using CUstream = struct CUstream_st*;
using CUmodule = struct CUmod_st*;
using CUfunction = struct CUfunc_st*;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;
using CUjit_option = int;
using CUdevice_attribute = int;
using CUfunction_attribute = int;
using CUstreamCaptureMode = int;
#endif

// Values of the driver's enums that optjit passes (fixed by the driver ABI).
constexpr int kAttrMultiprocessors = 16, kAttrCcMajor = 75, kAttrCcMinor = 76;
constexpr int kFuncAttrMaxThreadsPerBlock = 0; // CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK
constexpr int kJitErrorLogBuffer = 5, kJitErrorLogBufferBytes = 6;
constexpr int kCaptureThreadLocal = 1;
constexpr unsigned kEventDisableTiming = 2; // CU_EVENT_DISABLE_TIMING: a cheaper event, for ordering only

// Every driver entry point optjit uses, with the versioned symbol it is looked up by.
#define OPTJIT_CUDA_FUNCTIONS(X)                                                                                       \
  X(cuInit, (unsigned))                                                                                                \
  X(cuDriverGetVersion, (int*))                                                                                        \
  X(cuDeviceGetCount, (int*))                                                                                          \
  X(cuDeviceGet, (CUdevice*, int))                                                                                     \
  X(cuGetErrorName, (CUresult, const char**))                                                                          \
  X(cuDeviceGetAttribute, (int*, CUdevice_attribute, CUdevice))                                                        \
  X(cuDeviceGetName, (char*, int, CUdevice))                                                                           \
  X(cuDeviceTotalMem_v2, (size_t*, CUdevice))                                                                          \
  X(cuDevicePrimaryCtxRetain, (CUcontext*, CUdevice))                                                                  \
  X(cuCtxSetCurrent, (CUcontext))                                                                                      \
  X(cuCtxGetCurrent, (CUcontext*))                                                                                     \
  X(cuCtxSynchronize, ())                                                                                              \
  X(cuStreamCreate, (CUstream*, unsigned))                                                                             \
  X(cuMemAlloc_v2, (CUdeviceptr*, size_t))                                                                             \
  X(cuMemFree_v2, (CUdeviceptr))                                                                                       \
  X(cuMemAllocHost_v2, (void**, size_t))                                                                               \
  X(cuMemFreeHost, (void*))                                                                                            \
  X(cuStreamSynchronize, (CUstream))                                                                                   \
  X(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void*, size_t, CUstream))                                                \
  X(cuMemcpyDtoHAsync_v2, (void*, CUdeviceptr, size_t, CUstream))                                                      \
  X(cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                                \
  X(cuMemsetD8Async, (CUdeviceptr, unsigned char, size_t, CUstream))                                                   \
  X(cuModuleLoadDataEx, (CUmodule*, const void*, unsigned, CUjit_option*, void**))                                     \
  X(cuModuleGetFunction, (CUfunction*, CUmodule, const char*))                                                         \
  X(cuFuncGetAttribute, (int*, CUfunction_attribute, CUfunction))                                                      \
  X(cuModuleUnload, (CUmodule))                                                                                        \
  X(cuLaunchKernel,                                                                                                    \
    (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void**, void**))      \
  X(cuEventCreate, (CUevent*, unsigned))                                                                               \
  X(cuEventRecord, (CUevent, CUstream))                                                                                \
  X(cuEventSynchronize, (CUevent))                                                                                     \
  X(cuEventQuery, (CUevent))                                                                                           \
  X(cuEventElapsedTime, (float*, CUevent, CUevent))                                                                    \
  X(cuEventDestroy_v2, (CUevent))                                                                                      \
  X(cuStreamBeginCapture_v2, (CUstream, CUstreamCaptureMode))                                                          \
  X(cuStreamEndCapture, (CUstream, CUgraph*))                                                                          \
  X(cuGraphInstantiateWithFlags, (CUgraphExec*, CUgraph, unsigned long long))                                          \
  X(cuGraphLaunch, (CUgraphExec, CUstream))                                                                            \
  X(cuGraphExecDestroy, (CUgraphExec))                                                                                 \
  X(cuGraphDestroy, (CUgraph))

struct DriverTable {
#define OPTJIT_DECLARE(name, params) CUresult(*name) params = nullptr;
  OPTJIT_CUDA_FUNCTIONS(OPTJIT_DECLARE)
#undef OPTJIT_DECLARE
};

#ifdef OPTJIT_HAVE_CUDA_H
// Every entry must have the header's signature, or a call through the table would be undefined.
#define OPTJIT_CHECK_SIGNATURE(name, params)                                                                           \
  static_assert(std::is_same_v<decltype(DriverTable::name), decltype(&::name)>,                                        \
                "driver table entry " #name " does not match cuda.h");
OPTJIT_CUDA_FUNCTIONS(OPTJIT_CHECK_SIGNATURE)
#undef OPTJIT_CHECK_SIGNATURE
#endif

std::string error_name(const DriverTable& table, CUresult result) {
  const char* name = nullptr;
  if (table.cuGetErrorName && table.cuGetErrorName(result, &name) == CUresult{} && name)
    return name;
  return {};
}

// The one conversion of a CUresult into an optjit::Error.
void check(const DriverTable& table, CUresult result, const char* call) {
  if (result != CUresult{})
    throw_cuda_error(call, static_cast<int>(result), error_name(table, result));
}

// dlopen + dlsym of every table entry; the handle stays open for the process (driver state lives as long as the
// library).
DriverTable load_table(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error("no CUDA driver: could not load " + library + " (" + (why ? why : "unknown reason") +
                "); GPU devices need an NVIDIA driver, the CPU path works without one");
  }
  DriverTable table;
#define OPTJIT_RESOLVE(name, params)                                                                                   \
  table.name = reinterpret_cast<decltype(table.name)>(dlsym(handle, #name));                                           \
  if (!table.name) {                                                                                                   \
    dlclose(handle);                                                                                                   \
    throw Error("CUDA driver " + library + " lacks the symbol " #name " that optjit needs");                           \
  }
  OPTJIT_CUDA_FUNCTIONS(OPTJIT_RESOLVE)
#undef OPTJIT_RESOLVE
  return table;
}

CudaDriverInfo initialise(const DriverTable& table) {
  check(table, table.cuInit(0), "cuInit");
  CudaDriverInfo info;
  check(table, table.cuDriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  check(table, table.cuDeviceGetCount(&info.device_count), "cuDeviceGetCount");
  return info;
}

struct DeviceState {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  cuda::DeviceProperties properties;
};

// The loaded driver and the devices opened so far.
struct Driver {
  DriverTable table;
  CudaDriverInfo info;
  std::vector<std::unique_ptr<DeviceState>> devices;
  std::mutex mutex;
};

// The process-wide driver, or the error that loading it gave (remembered: a missing driver is not retried).
struct DriverSlot {
  std::unique_ptr<Driver> driver;
  std::string error;
};

DriverSlot& driver_slot() {
  static DriverSlot slot = [] {
    DriverSlot s;
    const char* library = std::getenv("OPTJIT_CUDA_LIBRARY");
    try {
      auto d = std::make_unique<Driver>();
      d->table = load_table(library && *library ? library : "libcuda.so.1");
      d->info = initialise(d->table);
      d->devices.resize(static_cast<std::size_t>(d->info.device_count));
      s.driver = std::move(d);
    } catch (const Error& e) {
      s.error = e.what();
    }
    return s;
  }();
  return slot;
}

Driver& loaded() {
  DriverSlot& slot = driver_slot();
  if (!slot.driver)
    throw Error(slot.error);
  return *slot.driver;
}

// Opens `device` (primary context, optjit's stream, properties) on first use and makes its context current.
DeviceState& open_device(int device) {
  Driver& d = loaded();
  if (device < 0 || device >= d.info.device_count)
    throw Error("no device cuda:" + std::to_string(device) + ": this machine has " +
                std::to_string(d.info.device_count) + " CUDA device(s)");
  std::lock_guard lock(d.mutex);
  auto& slot = d.devices[static_cast<std::size_t>(device)];
  if (!slot) {
    const DriverTable& t = d.table;
    auto state = std::make_unique<DeviceState>();
    CUdevice dev{};
    check(t, t.cuDeviceGet(&dev, device), "cuDeviceGet");
    check(t, t.cuDevicePrimaryCtxRetain(&state->context, dev), "cuDevicePrimaryCtxRetain");
    check(t, t.cuCtxSetCurrent(state->context), "cuCtxSetCurrent");
    check(t, t.cuStreamCreate(&state->stream, 0), "cuStreamCreate");
    char name[256] = {};
    check(t, t.cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
    cuda::DeviceProperties& p = state->properties;
    p.name = name;
    check(t, t.cuDeviceGetAttribute(&p.major, static_cast<CUdevice_attribute>(kAttrCcMajor), dev),
          "cuDeviceGetAttribute");
    check(t, t.cuDeviceGetAttribute(&p.minor, static_cast<CUdevice_attribute>(kAttrCcMinor), dev),
          "cuDeviceGetAttribute");
    check(t, t.cuDeviceGetAttribute(&p.multiprocessors, static_cast<CUdevice_attribute>(kAttrMultiprocessors), dev),
          "cuDeviceGetAttribute");
    check(t, t.cuDeviceTotalMem_v2(&p.memory_bytes, dev), "cuDeviceTotalMem_v2");
    slot = std::move(state);
  }
  return *slot;
}

// The table, with `device`'s context current on this thread. The current context is asked each time, not
// remembered: torch (the runtime API) switches it behind optjit's back when it changes devices.
const DriverTable& on(int device) {
  DeviceState& state = open_device(device);
  const DriverTable& t = loaded().table;
  CUcontext current = nullptr;
  check(t, t.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != state.context)
    check(t, t.cuCtxSetCurrent(state.context), "cuCtxSetCurrent");
  return t;
}

} // namespace

void throw_cuda_error(const std::string& call, int result, const std::string& name) {
  throw Error("CUDA driver call " + call + " failed with " + (name.empty() ? "error" : name) + " (" +
              std::to_string(result) + ")");
}

CudaDriverInfo probe_cuda_driver(const std::string& library) { return initialise(load_table(library)); }

namespace cuda {

const CudaDriverInfo& driver() { return loaded().info; }

bool available() {
  const DriverSlot& slot = driver_slot();
  return slot.driver && slot.driver->info.device_count > 0;
}

const DeviceProperties& properties(int device) { return open_device(device).properties; }

void make_current(int device) { on(device); }

namespace {

struct ScopedStream {
  int device;
  Stream stream;
  const StreamScope* scope;
};
// The StreamScopes alive on this thread, innermost last.
thread_local std::vector<ScopedStream> scoped_streams;

} // namespace

Stream stream(int device) {
  for (auto it = scoped_streams.rbegin(); it != scoped_streams.rend(); ++it)
    if (it->device == device)
      return it->stream;
  return open_device(device).stream;
}

StreamScope::StreamScope(int device, Stream stream) {
  const DriverTable& t = loaded().table;
  CUcontext current = nullptr;
  check(t, t.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  caller_context_ = current;
  scoped_streams.push_back({device, stream, this});
}

StreamScope::~StreamScope() {
  // Its own entry (scopes end in reverse order; erasing by identity keeps the others right if one does not).
  for (auto it = scoped_streams.rbegin(); it != scoped_streams.rend(); ++it)
    if (it->scope == this) {
      scoped_streams.erase(std::next(it).base());
      break;
    }
  const DriverTable& t = loaded().table;
  (void)t.cuCtxSetCurrent(static_cast<CUcontext>(caller_context_)); // the caller's context (torch's device) again
}

void synchronize(int device) {
  const DriverTable& t = on(device);
  check(t, t.cuCtxSynchronize(), "cuCtxSynchronize");
}

DevicePtr mem_alloc(int device, std::size_t bytes) {
  const DriverTable& t = on(device);
  CUdeviceptr ptr = 0;
  check(t, t.cuMemAlloc_v2(&ptr, bytes), "cuMemAlloc_v2");
  return ptr;
}

void mem_free(int device, DevicePtr ptr) {
  const DriverTable& t = on(device);
  check(t, t.cuMemFree_v2(ptr), "cuMemFree_v2");
}

namespace {

// Waits for what is queued on stream(device): the end of a synchronous operation.
void wait_for_stream(const DriverTable& t, CUstream stream) {
  check(t, t.cuStreamSynchronize(stream), "cuStreamSynchronize");
}

} // namespace

void copy_to_device(int device, DevicePtr dst, const void* src, std::size_t bytes) {
  const DriverTable& t = on(device);
  auto s = static_cast<CUstream>(stream(device));
  check(t, t.cuMemcpyHtoDAsync_v2(dst, src, bytes, s), "cuMemcpyHtoDAsync_v2");
  wait_for_stream(t, s);
}

void copy_to_host(int device, void* dst, DevicePtr src, std::size_t bytes) {
  const DriverTable& t = on(device);
  auto s = static_cast<CUstream>(stream(device));
  check(t, t.cuMemcpyDtoHAsync_v2(dst, src, bytes, s), "cuMemcpyDtoHAsync_v2");
  wait_for_stream(t, s);
}

void copy_on_device(int device, DevicePtr dst, DevicePtr src, std::size_t bytes) {
  const DriverTable& t = on(device);
  auto s = static_cast<CUstream>(stream(device));
  check(t, t.cuMemcpyDtoDAsync_v2(dst, src, bytes, s), "cuMemcpyDtoDAsync_v2");
  wait_for_stream(t, s);
}

void copy_to_device_async(int device, DevicePtr dst, const void* src, std::size_t bytes, Stream stream) {
  const DriverTable& t = on(device);
  check(t, t.cuMemcpyHtoDAsync_v2(dst, src, bytes, static_cast<CUstream>(stream)), "cuMemcpyHtoDAsync_v2");
}

void copy_on_device_async(int device, DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream) {
  const DriverTable& t = on(device);
  check(t, t.cuMemcpyDtoDAsync_v2(dst, src, bytes, static_cast<CUstream>(stream)), "cuMemcpyDtoDAsync_v2");
}

void memset_zero_async(int device, DevicePtr dst, std::size_t bytes, Stream stream) {
  const DriverTable& t = on(device);
  check(t, t.cuMemsetD8Async(dst, 0, bytes, static_cast<CUstream>(stream)), "cuMemsetD8Async");
}

void memset_zero(int device, DevicePtr dst, std::size_t bytes) {
  const DriverTable& t = on(device);
  auto s = static_cast<CUstream>(stream(device));
  check(t, t.cuMemsetD8Async(dst, 0, bytes, s), "cuMemsetD8Async");
  wait_for_stream(t, s);
}

void* host_alloc_pinned(int device, std::size_t bytes) {
  const DriverTable& t = on(device);
  void* ptr = nullptr;
  check(t, t.cuMemAllocHost_v2(&ptr, bytes), "cuMemAllocHost_v2");
  return ptr;
}

void host_free_pinned(int device, void* ptr) {
  const DriverTable& t = on(device);
  check(t, t.cuMemFreeHost(ptr), "cuMemFreeHost");
}

Module load_module(int device, const std::string& ptx) {
  const DriverTable& t = on(device);
  std::string log(8192, '\0');
  CUjit_option keys[] = {static_cast<CUjit_option>(kJitErrorLogBuffer),
                         static_cast<CUjit_option>(kJitErrorLogBufferBytes)};
  void* values[] = {log.data(), reinterpret_cast<void*>(static_cast<uintptr_t>(log.size()))};
  CUmodule module = nullptr;
  CUresult result = t.cuModuleLoadDataEx(&module, ptx.c_str(), 2, keys, values);
  if (result != CUresult{}) {
    log.resize(log.find('\0'));
    throw Error("CUDA driver call cuModuleLoadDataEx failed with " + error_name(t, result) + " (" +
                std::to_string(static_cast<int>(result)) + "); JIT log: " + (log.empty() ? "(empty)" : log));
  }
  return module;
}

void unload_module(int device, Module module) {
  const DriverTable& t = on(device);
  check(t, t.cuModuleUnload(static_cast<CUmodule>(module)), "cuModuleUnload");
}

Function get_function(int device, Module module, const std::string& name) {
  const DriverTable& t = on(device);
  CUfunction function = nullptr;
  check(t, t.cuModuleGetFunction(&function, static_cast<CUmodule>(module), name.c_str()), "cuModuleGetFunction");
  return function;
}

int max_block_threads(int device, Function function) {
  const DriverTable& t = on(device);
  int threads = 0;
  check(t,
        t.cuFuncGetAttribute(&threads, static_cast<CUfunction_attribute>(kFuncAttrMaxThreadsPerBlock),
                             static_cast<CUfunction>(function)),
        "cuFuncGetAttribute");
  return threads;
}

void launch(int device, Function function, unsigned grid, unsigned block, void** params, Stream stream) {
  const DriverTable& t = on(device);
  check(t,
        t.cuLaunchKernel(static_cast<CUfunction>(function), grid, 1, 1, block, 1, 1, 0, static_cast<CUstream>(stream),
                         params, nullptr),
        "cuLaunchKernel");
}

Event event_create(int device, bool timing) {
  const DriverTable& t = on(device);
  CUevent event = nullptr;
  check(t, t.cuEventCreate(&event, timing ? 0u : kEventDisableTiming), "cuEventCreate");
  return event;
}

void event_record(int device, Event event, Stream stream) {
  const DriverTable& t = on(device);
  check(t, t.cuEventRecord(static_cast<CUevent>(event), static_cast<CUstream>(stream)), "cuEventRecord");
}

void event_synchronize(int device, Event event) {
  const DriverTable& t = on(device);
  check(t, t.cuEventSynchronize(static_cast<CUevent>(event)), "cuEventSynchronize");
}

bool event_done(int device, Event event) {
  const DriverTable& t = on(device);
  const CUresult result = t.cuEventQuery(static_cast<CUevent>(event));
  if (result == static_cast<CUresult>(600)) // CUDA_ERROR_NOT_READY: work before the event is still queued or running
    return false;
  check(t, result, "cuEventQuery");
  return true;
}

float event_elapsed_ms(int device, Event start, Event end) {
  const DriverTable& t = on(device);
  float ms = 0;
  check(t, t.cuEventElapsedTime(&ms, static_cast<CUevent>(start), static_cast<CUevent>(end)), "cuEventElapsedTime");
  return ms;
}

void event_destroy(int device, Event event) {
  const DriverTable& t = on(device);
  check(t, t.cuEventDestroy_v2(static_cast<CUevent>(event)), "cuEventDestroy_v2");
}

void begin_capture(int device, Stream stream) {
  const DriverTable& t = on(device);
  check(t,
        t.cuStreamBeginCapture_v2(static_cast<CUstream>(stream), static_cast<CUstreamCaptureMode>(kCaptureThreadLocal)),
        "cuStreamBeginCapture_v2");
}

GraphExec end_capture(int device, Stream stream) {
  const DriverTable& t = on(device);
  CUgraph graph = nullptr;
  check(t, t.cuStreamEndCapture(static_cast<CUstream>(stream), &graph), "cuStreamEndCapture");
  CUgraphExec exec = nullptr;
  CUresult result = t.cuGraphInstantiateWithFlags(&exec, graph, 0);
  t.cuGraphDestroy(graph); // the executable graph keeps what it needs
  check(t, result, "cuGraphInstantiateWithFlags");
  return exec;
}

void graph_launch(int device, GraphExec graph, Stream stream) {
  const DriverTable& t = on(device);
  check(t, t.cuGraphLaunch(static_cast<CUgraphExec>(graph), static_cast<CUstream>(stream)), "cuGraphLaunch");
}

void graph_destroy(int device, GraphExec graph) {
  const DriverTable& t = on(device);
  check(t, t.cuGraphExecDestroy(static_cast<CUgraphExec>(graph)), "cuGraphExecDestroy");
}

} // namespace cuda
} // namespace optjit
