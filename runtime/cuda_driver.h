// The CUDA Driver API, loaded at run time with dlopen so that a build without CUDA runs everywhere. No CUDA type
// appears outside cuda_driver.cpp.
#pragma once

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

} // namespace optjit
