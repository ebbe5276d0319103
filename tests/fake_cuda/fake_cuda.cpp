// A stand-in for libcuda.so.1 whose cuInit fails as on a machine with a driver but no usable GPU
// (CUDA_ERROR_NO_DEVICE = 100), so the loader's failing-call path runs without NVIDIA hardware.
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
}
