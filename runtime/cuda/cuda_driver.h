// The CUDA Driver API, loaded at run time with dlopen so that a build without CUDA runs everywhere: one table of
// the driver functions optjit uses (by their versioned symbols), every CUresult turned into an optjit::Error by one
// helper, and the small set of operations the rest of optjit needs. No CUDA type appears outside cuda_driver.cpp:
// handles cross this header as opaque pointers and device addresses as uint64_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace optjit {

struct CudaDriverInfo {
  int driver_version = 0; // e.g. 12040
  int device_count = 0;
};

// Loads `library` (default libcuda.so.1), resolves every driver function optjit uses and initialises the driver.
// Throws optjit::Error naming the library, the missing symbol or the failing call (with cuGetErrorName's answer).
CudaDriverInfo probe_cuda_driver(const std::string& library = "libcuda.so.1");

// Converts a CUresult into an optjit::Error naming `call` and the result's name; `name` is what cuGetErrorName
// gave (empty when the driver could not say).
[[noreturn]] void throw_cuda_error(const std::string& call, int result, const std::string& name);

namespace cuda {

using DevicePtr = uint64_t;
using Stream = void*;
using Module = void*;
using Function = void*;
using Event = void*;
using GraphExec = void*;

// The process-wide driver: loaded on first use from OPTJIT_CUDA_LIBRARY or libcuda.so.1. A failed load is
// remembered and every later call throws the same clear error; the CPU path never touches it.
const CudaDriverInfo& driver();
// Whether a driver with at least one device is present (never throws).
bool available();

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0; // compute capability
  int multiprocessors = 0;
  std::size_t memory_bytes = 0;
};
// Throws when `device` is not an index below the device count.
const DeviceProperties& properties(int device);

// Makes `device`'s primary context current on this thread (cheap when it already is).
void make_current(int device);
// The stream optjit queues work for `device` on from this thread: the innermost StreamScope's for the device, else
// optjit's own (created blocking, so ordered with the legacy default stream).
Stream stream(int device);
void synchronize(int device);

// While it lives, stream(device) on this thread is `stream`: launches and copies for `device` queue on it, in order
// with the work the caller queues there (the Python package passes torch's current stream, which may be one that
// does not wait for the legacy default stream). Scopes nest; each ends the one it began. Its end makes the context
// that was current at its start current again, so the caller's current device (torch's) is left as it was.
class StreamScope {
public:
  StreamScope(int device, Stream stream);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

private:
  void* caller_context_ = nullptr;
};

DevicePtr mem_alloc(int device, std::size_t bytes);
void mem_free(int device, DevicePtr ptr);
// The synchronous copies and the memset are queued on stream(device), after the work queued there before them, and
// return when they are done.
void copy_to_device(int device, DevicePtr dst, const void* src, std::size_t bytes);
void copy_to_host(int device, void* dst, DevicePtr src, std::size_t bytes);
void copy_on_device(int device, DevicePtr dst, DevicePtr src, std::size_t bytes);
void copy_to_device_async(int device, DevicePtr dst, const void* src, std::size_t bytes, Stream stream);
// Queued on `stream`, they return at once.
void copy_on_device_async(int device, DevicePtr dst, DevicePtr src, std::size_t bytes, Stream stream);
void memset_zero_async(int device, DevicePtr dst, std::size_t bytes, Stream stream);
void memset_zero(int device, DevicePtr dst, std::size_t bytes);
// Page-locked host memory (async copies from it need no staging).
void* host_alloc_pinned(int device, std::size_t bytes);
void host_free_pinned(int device, void* ptr);

// Loads PTX text into a module on `device`; a JIT failure throws with the driver's error log in the message.
Module load_module(int device, const std::string& ptx);
void unload_module(int device, Module module);
Function get_function(int device, Module module, const std::string& name);
// The most threads a block of `function` can have on its device: fewer than 1024 where its registers allow fewer.
int max_block_threads(int device, Function function);
void launch(int device, Function function, unsigned grid, unsigned block, void** params, Stream stream);

// `timing`: the event can time (event_elapsed_ms); without, it only orders and waits (cheaper).
Event event_create(int device, bool timing = true);
void event_record(int device, Event event, Stream stream);
void event_synchronize(int device, Event event);
// Whether the work queued before `event`'s record is done, without waiting (cuEventQuery).
bool event_done(int device, Event event);
float event_elapsed_ms(int device, Event start, Event end);
void event_destroy(int device, Event event);

// CUDA graphs: capture what is launched on `stream` between begin and end into an executable graph.
void begin_capture(int device, Stream stream);
GraphExec end_capture(int device, Stream stream);
void graph_launch(int device, GraphExec graph, Stream stream);
void graph_destroy(int device, GraphExec graph);

} // namespace cuda
} // namespace optjit
