// A stand-in for libcuda.so.1 with one device (compute capability 9.0) whose memory is the host's: device addresses
// are host addresses, copies and memsets happen at once, modules load any PTX, and launches are counted but run
// nothing. It lets the host side of a GPU step run without NVIDIA hardware, to count what that side asks of the
// driver: launches, and every call that makes the host wait for the device (stream, context and event
// synchronizations). Tests read and reset the counts through optjit_fake_cuda_counts (tests/compiler/
// test_host_waits.cpp), in a process that loads this library as its driver (OPTJIT_CUDA_LIBRARY).
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

struct Counts {
  long launches = 0;
  long host_waits = 0; // cuStreamSynchronize, cuCtxSynchronize, cuEventSynchronize
  long device_to_host_copies = 0;
};
Counts counts;

int dummy_handle; // what handles point at: the driver's objects need no state here

} // namespace

extern "C" {

// The counts so far; `reset` zeroes them after reading.
void optjit_fake_cuda_counts(long* launches, long* host_waits, long* device_to_host_copies, int reset) {
  *launches = counts.launches;
  *host_waits = counts.host_waits;
  *device_to_host_copies = counts.device_to_host_copies;
  if (reset)
    counts = Counts{};
}

int cuInit(unsigned) { return 0; }
int cuDriverGetVersion(int* version) {
  *version = 12040;
  return 0;
}
int cuDeviceGetCount(int* count) {
  *count = 1;
  return 0;
}
int cuDeviceGet(int* device, int ordinal) {
  *device = ordinal;
  return ordinal == 0 ? 0 : 101; // CUDA_ERROR_INVALID_DEVICE
}
int cuGetErrorName(int, const char** name) {
  *name = "CUDA_ERROR_FAKE";
  return 0;
}
int cuDeviceGetAttribute(int* value, int attribute, int) {
  *value = attribute == 16 ? 132 /* multiprocessors */ : attribute == 75 ? 9 : attribute == 76 ? 0 : 1;
  return 0;
}
int cuDeviceGetName(char* name, int length, int) {
  std::strncpy(name, "host-memory fake GPU", static_cast<std::size_t>(length));
  return 0;
}
int cuDeviceTotalMem_v2(std::size_t* bytes, int) {
  *bytes = std::size_t{1} << 34;
  return 0;
}
int cuDevicePrimaryCtxRetain(void** context, int) {
  *context = &dummy_handle;
  return 0;
}
thread_local void* current_context = nullptr;
int cuCtxSetCurrent(void* context) {
  current_context = context;
  return 0;
}
int cuCtxGetCurrent(void** context) {
  *context = current_context;
  return 0;
}
int cuCtxSynchronize() {
  ++counts.host_waits;
  return 0;
}
int cuStreamCreate(void** stream, unsigned) {
  *stream = &dummy_handle;
  return 0;
}
int cuStreamSynchronize(void*) {
  ++counts.host_waits;
  return 0;
}
int cuMemAlloc_v2(unsigned long long* address, std::size_t bytes) {
  const std::size_t size = (bytes + 255) / 256 * 256 + 256;
  void* p = std::aligned_alloc(256, size);
  if (p) // zeroed, so that what launches would have written (nothing runs here) reads the same every time
    std::memset(p, 0, size);
  *address = reinterpret_cast<uintptr_t>(p);
  return p ? 0 : 2; // CUDA_ERROR_OUT_OF_MEMORY
}
int cuMemFree_v2(unsigned long long address) {
  std::free(reinterpret_cast<void*>(static_cast<uintptr_t>(address)));
  return 0;
}
int cuMemAllocHost_v2(void** p, std::size_t bytes) {
  *p = std::malloc(bytes + 1);
  return *p ? 0 : 2;
}
int cuMemFreeHost(void* p) {
  std::free(p);
  return 0;
}
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, std::size_t bytes, void*) {
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), src, bytes);
  return 0;
}
int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, std::size_t bytes, void*) {
  ++counts.device_to_host_copies;
  std::memcpy(dst, reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes);
  return 0;
}
int cuMemcpyDtoDAsync_v2(unsigned long long dst, unsigned long long src, std::size_t bytes, void*) {
  std::memmove(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)),
               reinterpret_cast<const void*>(static_cast<uintptr_t>(src)), bytes);
  return 0;
}
int cuMemsetD8Async(unsigned long long dst, unsigned char value, std::size_t bytes, void*) {
  std::memset(reinterpret_cast<void*>(static_cast<uintptr_t>(dst)), value, bytes);
  return 0;
}
int cuModuleLoadDataEx(void** module, const void*, unsigned, int*, void**) {
  *module = &dummy_handle;
  return 0;
}
int cuModuleGetFunction(void** function, void*, const char*) {
  *function = &dummy_handle;
  return 0;
}
int cuFuncGetAttribute(int* value, int, void*) {
  *value = 1024;
  return 0;
}
int cuModuleUnload(void*) { return 0; }
int cuLaunchKernel(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**, void**) {
  ++counts.launches;
  return 0;
}
int cuEventCreate(void** event, unsigned) {
  *event = &dummy_handle;
  return 0;
}
int cuEventRecord(void*, void*) { return 0; }
int cuEventSynchronize(void*) {
  ++counts.host_waits;
  return 0;
}
int cuEventQuery(void*) { return 0; } // every queued copy is done: nothing runs later here
int cuEventElapsedTime(float* ms, void*, void*) {
  *ms = 0;
  return 0;
}
int cuEventDestroy_v2(void*) { return 0; }
// Graph capture is not faked: a step that captures fails clearly.
int cuStreamBeginCapture_v2(void*, int) { return 801; } // CUDA_ERROR_NOT_SUPPORTED
int cuStreamEndCapture(void*, void**) { return 801; }
int cuGraphInstantiateWithFlags(void**, void*, unsigned long long) { return 801; }
int cuGraphLaunch(void*, void*) { return 801; }
int cuGraphExecDestroy(void*) { return 0; }
int cuGraphDestroy(void*) { return 0; }
}
