// A stand-in for libcuda.so.1 (built twice: with every symbol, and as an old driver that lacks one) whose cuInit fails
// as on a machine with a driver but no usable GPU (CUDA_ERROR_NO_DEVICE = 100), so the loader's failing-call path runs
// without NVIDIA hardware.
extern "C" {
int cuInit(unsigned) { return 100; }
int cuDriverGetVersion(int* version) {
  *version = 12040;
  return 0;
}
int cuDeviceGetCount(int* count) {
  *count = 0;
  return 0;
}
int cuDeviceGet(int*, int) { return 100; }
int cuGetErrorName(int result, const char** name) {
  *name = result == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN";
  return 0;
}
// The rest of the table: present, so the loader gets as far as cuInit, and failing if ever called.
#define OPTJIT_FAKE(name)                                                                                              \
  int name() { return 999; }
OPTJIT_FAKE(cuDeviceGetAttribute)
OPTJIT_FAKE(cuDeviceGetName)
OPTJIT_FAKE(cuDeviceTotalMem_v2)
OPTJIT_FAKE(cuDevicePrimaryCtxRetain)
OPTJIT_FAKE(cuCtxSetCurrent)
OPTJIT_FAKE(cuCtxGetCurrent)
OPTJIT_FAKE(cuCtxSynchronize)
OPTJIT_FAKE(cuStreamCreate)
OPTJIT_FAKE(cuMemAlloc_v2)
OPTJIT_FAKE(cuMemFree_v2)
OPTJIT_FAKE(cuMemAllocHost_v2)
OPTJIT_FAKE(cuMemFreeHost)
OPTJIT_FAKE(cuStreamSynchronize)
OPTJIT_FAKE(cuMemcpyHtoDAsync_v2)
OPTJIT_FAKE(cuMemcpyDtoHAsync_v2)
OPTJIT_FAKE(cuMemcpyDtoDAsync_v2)
OPTJIT_FAKE(cuMemsetD8Async)
OPTJIT_FAKE(cuModuleLoadDataEx)
OPTJIT_FAKE(cuModuleGetFunction)
OPTJIT_FAKE(cuFuncGetAttribute)
OPTJIT_FAKE(cuModuleUnload)
OPTJIT_FAKE(cuLaunchKernel)
OPTJIT_FAKE(cuEventCreate)
OPTJIT_FAKE(cuEventRecord)
OPTJIT_FAKE(cuEventSynchronize)
OPTJIT_FAKE(cuEventQuery)
OPTJIT_FAKE(cuEventElapsedTime)
OPTJIT_FAKE(cuEventDestroy_v2)
OPTJIT_FAKE(cuStreamBeginCapture_v2)
OPTJIT_FAKE(cuStreamEndCapture)
#ifndef OPTJIT_FAKE_OLD_DRIVER // a driver older than CUDA 11.4 lacks it
OPTJIT_FAKE(cuGraphInstantiateWithFlags)
#endif
OPTJIT_FAKE(cuGraphLaunch)
OPTJIT_FAKE(cuGraphExecDestroy)
OPTJIT_FAKE(cuGraphDestroy)
}
