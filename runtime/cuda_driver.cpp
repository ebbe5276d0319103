#include "runtime/cuda_driver.h"
#include "runtime/error.h"

#include <dlfcn.h>

#ifdef OPTJIT_HAVE_CUDA_H
#include <cuda.h>

#include <type_traits>
#endif

namespace optjit {
namespace {

#ifdef OPTJIT_HAVE_CUDA_H
using CUresult = ::CUresult;
using CUdevice = ::CUdevice;
#else
using CUresult = int;  // the driver's enum is an int-sized C enum
using CUdevice = int;
#endif

// Every driver entry point optjit uses, with the versioned symbol it is looked up by.
#define OPTJIT_CUDA_FUNCTIONS(X)                                                                   \
  X(cuInit, "cuInit", (unsigned))                                                                  \
  X(cuDriverGetVersion, "cuDriverGetVersion", (int*))                                              \
  X(cuDeviceGetCount, "cuDeviceGetCount", (int*))                                                  \
  X(cuDeviceGet, "cuDeviceGet", (CUdevice*, int))                                                  \
  X(cuGetErrorName, "cuGetErrorName", (CUresult, const char**))

struct DriverTable {
#define OPTJIT_DECLARE(name, symbol, params) CUresult(*name) params = nullptr;
  OPTJIT_CUDA_FUNCTIONS(OPTJIT_DECLARE)
#undef OPTJIT_DECLARE
};

#ifdef OPTJIT_HAVE_CUDA_H
// Every entry must have the header's signature, or a call through the table would be undefined.
#define OPTJIT_CHECK_SIGNATURE(name, symbol, params)                                                \
  static_assert(std::is_same_v<decltype(DriverTable::name), decltype(&::name)>,                     \
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

void check(const DriverTable& table, CUresult result, const char* call) {
  if (result != CUresult{})
    throw_cuda_error(call, static_cast<int>(result), error_name(table, result));
}

} // namespace

void throw_cuda_error(const std::string& call, int result, const std::string& name) {
  throw Error("CUDA driver call " + call + " failed with " + (name.empty() ? "error" : name) + " (" +
              std::to_string(result) + ")");
}

CudaDriverInfo probe_cuda_driver(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error("no CUDA driver: could not load " + library + " (" + (why ? why : "unknown reason") +
                "); GPU devices need an NVIDIA driver, the CPU path works without one");
  }
  DriverTable table;
#define OPTJIT_RESOLVE(name, symbol, params)                                                        \
  table.name = reinterpret_cast<decltype(table.name)>(dlsym(handle, symbol));                       \
  if (!table.name) {                                                                                \
    dlclose(handle);                                                                                \
    throw Error("CUDA driver " + library + " lacks the symbol " symbol " that optjit needs");        \
  }
  OPTJIT_CUDA_FUNCTIONS(OPTJIT_RESOLVE)
#undef OPTJIT_RESOLVE
  // The handle stays open for the process: driver state lives as long as the library.
  check(table, table.cuInit(0), "cuInit");
  CudaDriverInfo info;
  check(table, table.cuDriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  check(table, table.cuDeviceGetCount(&info.device_count), "cuDeviceGetCount");
  return info;
}

} // namespace optjit
