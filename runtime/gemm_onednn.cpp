// runtime/gemm.h on the CPU: oneDNN's matmul primitive, through its C API, loaded with dlopen. The header is
// oneDNN's own (libdnnl-dev): the function table below is typed from it, so a signature that changed would not
// compile. Every oneDNN status that is not success becomes an optjit::Error naming the call.
#include "runtime/error.h"
#include "runtime/gemm.h"
#include "runtime/low_precision.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <dlfcn.h>
#include <spdlog/fmt/fmt.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

namespace optjit {
namespace {

#define OPTJIT_ONEDNN_FUNCTIONS(X)                                                                                     \
  X(dnnl_engine_create)                                                                                                \
  X(dnnl_stream_create)                                                                                                \
  X(dnnl_stream_wait)                                                                                                  \
  X(dnnl_stream_destroy)                                                                                               \
  X(dnnl_memory_desc_init_by_strides)                                                                                  \
  X(dnnl_memory_desc_get_size)                                                                                         \
  X(dnnl_matmul_desc_init)                                                                                             \
  X(dnnl_primitive_attr_create)                                                                                        \
  X(dnnl_primitive_attr_destroy)                                                                                       \
  X(dnnl_primitive_attr_set_scratchpad_mode)                                                                           \
  X(dnnl_primitive_attr_set_output_scales)                                                                             \
  X(dnnl_primitive_attr_set_post_ops)                                                                                  \
  X(dnnl_post_ops_create)                                                                                              \
  X(dnnl_post_ops_append_sum)                                                                                          \
  X(dnnl_post_ops_destroy)                                                                                             \
  X(dnnl_primitive_desc_create)                                                                                        \
  X(dnnl_primitive_desc_destroy)                                                                                       \
  X(dnnl_primitive_desc_query)                                                                                         \
  X(dnnl_primitive_desc_query_md)                                                                                      \
  X(dnnl_primitive_create)                                                                                             \
  X(dnnl_primitive_destroy)                                                                                            \
  X(dnnl_primitive_execute)                                                                                            \
  X(dnnl_memory_create)                                                                                                \
  X(dnnl_memory_destroy)                                                                                               \
  X(dnnl_status2str)

struct OneDnn {
#define OPTJIT_ONEDNN_MEMBER(name) decltype(&::name) name = nullptr;
  OPTJIT_ONEDNN_FUNCTIONS(OPTJIT_ONEDNN_MEMBER)
#undef OPTJIT_ONEDNN_MEMBER
  dnnl_engine_t engine = nullptr; // the CPU engine, for the process's life
};

std::string library_name() {
  const char* name = std::getenv("OPTJIT_ONEDNN_LIBRARY");
  return name && *name ? name : "libdnnl.so.2";
}

// Loads `name` and resolves every function; returns why it could not, or an empty string.
std::string load(const std::string& name, OneDnn& lib) {
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    return "matrix multiplies on the CPU run in oneDNN, and " + name + " does not load (" +
           (why ? why : "no reason given") +
           "): install it (Debian 12: apt install libdnnl2; tools/install_deps.sh does), or set "
           "OPTJIT_ONEDNN_LIBRARY to its path";
  }
#define OPTJIT_ONEDNN_RESOLVE(function)                                                                                \
  lib.function = reinterpret_cast<decltype(&::function)>(dlsym(handle, #function));                                    \
  if (!lib.function)                                                                                                   \
    return name + " has no " #function ": optjit needs oneDNN 2.x (libdnnl.so.2)";
  OPTJIT_ONEDNN_FUNCTIONS(OPTJIT_ONEDNN_RESOLVE)
#undef OPTJIT_ONEDNN_RESOLVE
  if (lib.dnnl_engine_create(&lib.engine, dnnl_cpu, 0) != dnnl_success)
    return name + " loads but makes no CPU engine";
  return {};
}

// The process's library, loaded once; a failed load is remembered and every later use throws the same error.
const OneDnn& onednn() {
  static std::once_flag once;
  static OneDnn lib;
  static std::string failure;
  std::call_once(once, [] { failure = load(library_name(), lib); });
  if (!failure.empty())
    throw Error(failure);
  return lib;
}

void check(const OneDnn& lib, dnnl_status_t status, const char* call, const GemmShape& shape) {
  if (status != dnnl_success)
    throw Error(std::string("oneDNN's ") + call + " failed (" + lib.dnnl_status2str(status) + ") for the product " +
                shape.to_string());
}

dnnl_data_type_t onednn_dtype(Dtype dtype) { return dtype == Dtype::bf16 ? dnnl_bf16 : dnnl_f32; }

// A batch of `rows` x `cols` matrices (as the product reads them), each dense and row-major, or stored transposed
// (cols x rows, row-major) when `transposed`.
dnnl_memory_desc_t matrices(const OneDnn& lib, const GemmShape& shape, int64_t rows, int64_t cols, bool transposed,
                            Dtype dtype) {
  const dnnl_dims_t dims = {shape.batch, rows, cols};
  const dnnl_dims_t strides = {rows * cols, transposed ? 1 : cols, transposed ? rows : 1};
  dnnl_memory_desc_t md;
  check(lib, lib.dnnl_memory_desc_init_by_strides(&md, 3, dims, onednn_dtype(dtype), strides),
        "dnnl_memory_desc_init_by_strides", shape);
  return md;
}

} // namespace

// Per thread: the stream runs execute on, the scratchpad (the primitives' scratch is the caller's, so one primitive
// runs from several threads at once), and a widened product's f32 copies of its bf16 matrices.
struct Gemm::ThreadContext {
  dnnl_stream_t stream = nullptr;
  std::vector<std::byte> scratchpad;
  std::vector<float> widened_a, widened_b, widened_c;
  ~ThreadContext() {
    if (stream)
      onednn().dnnl_stream_destroy(stream);
  }
};

struct Gemm::Primitive {
  dnnl_memory_desc_t a, b, c, scratchpad;
  dnnl_primitive_t primitive = nullptr;
  ~Primitive() {
    if (primitive)
      onednn().dnnl_primitive_destroy(primitive);
  }
};

// oneDNN 2.x has bf16 matmul kernels only on CPUs with AVX512 (AVX512-BF16 or AMX natively, AVX512_CORE emulated):
// elsewhere (AVX2's x86, AMD's Zen 3 among them) a bf16 product is widened, its operands converted to f32 (exact)
// and multiplied by the library's f32 kernel with the same f32 accumulation, alpha and beta, the result rounded once
// to bf16 by us as the library would: the sum torch's own CPU addmm computes on such a CPU.
Gemm::Gemm(const GemmShape& shape) : shape_(shape), implementation_("none") {
  check_gemm_shape(shape);
  if (shape.batch == 0 || shape.m == 0 || shape.n == 0 || shape.k == 0)
    return; // nothing to multiply: run() writes the zeros of an empty sum, if any
  primitive_ = make_primitive(shape, implementation_);
  if (primitive_)
    return;
  if (shape.operands == Dtype::f32 && shape.result == Dtype::f32)
    check(onednn(), dnnl_unimplemented, "dnnl_primitive_desc_create", shape);
  GemmShape widened = shape;
  widened.operands = widened.result = Dtype::f32;
  primitive_ = make_primitive(widened, implementation_);
  if (!primitive_)
    check(onednn(), dnnl_unimplemented, "dnnl_primitive_desc_create", widened);
  widened_ = true;
  implementation_ += " (bf16 widened to f32)";
}

// The primitive of `shape` (its dtypes as given), or null when the library has no kernel for its dtypes on this CPU
// (dnnl_unimplemented); any other failure throws. `implementation` gets the library's name for the kernel.
std::unique_ptr<Gemm::Primitive> Gemm::make_primitive(const GemmShape& shape, std::string& implementation) {
  const OneDnn& lib = onednn();
  auto p = std::make_unique<Gemm::Primitive>();
  p->a = matrices(lib, shape, shape.m, shape.k, shape.transpose_a, shape.operands);
  p->b = matrices(lib, shape, shape.k, shape.n, shape.transpose_b, shape.operands);
  p->c = matrices(lib, shape, shape.m, shape.n, false, shape.result);
  dnnl_matmul_desc_t desc;
  check(lib, lib.dnnl_matmul_desc_init(&desc, &p->a, &p->b, nullptr, &p->c), "dnnl_matmul_desc_init", shape);
  dnnl_primitive_attr_t attr = nullptr;
  check(lib, lib.dnnl_primitive_attr_create(&attr), "dnnl_primitive_attr_create", shape);
  dnnl_primitive_desc_t pd = nullptr;
  dnnl_status_t status = lib.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
  const float alpha = static_cast<float>(shape.alpha);
  if (status == dnnl_success && shape.alpha != 1.0) // dst = alpha (A B), then + beta dst: torch's addmm in f32
    status = lib.dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
  dnnl_post_ops_t post_ops = nullptr;
  if (status == dnnl_success && shape.beta != 0.0) {
    status = lib.dnnl_post_ops_create(&post_ops);
    if (status == dnnl_success)
      status = lib.dnnl_post_ops_append_sum(post_ops, static_cast<float>(shape.beta));
    if (status == dnnl_success)
      status = lib.dnnl_primitive_attr_set_post_ops(attr, post_ops);
  }
  if (status == dnnl_success)
    status = lib.dnnl_primitive_desc_create(&pd, &desc, attr, lib.engine, nullptr);
  if (post_ops)
    lib.dnnl_post_ops_destroy(post_ops);
  lib.dnnl_primitive_attr_destroy(attr);
  if (status == dnnl_unimplemented)
    return nullptr;
  check(lib, status, "dnnl_primitive_desc_create", shape);
  const char* impl = nullptr;
  status = lib.dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  if (status == dnnl_success) {
    implementation = impl ? impl : "unnamed";
    p->scratchpad = *lib.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    status = lib.dnnl_primitive_create(&p->primitive, pd);
  }
  lib.dnnl_primitive_desc_destroy(pd);
  check(lib, status, "dnnl_primitive_create", shape);
  return p;
}

namespace {

// `count` bf16 values as f32 (exact) into `to`, resized to hold them.
const float* widened(const void* from, int64_t count, std::vector<float>& to) {
  to.resize(static_cast<std::size_t>(count));
  const bfloat16* values = static_cast<const bfloat16*>(from);
  for (int64_t i = 0; i < count; ++i)
    to[static_cast<std::size_t>(i)] = static_cast<float>(values[i]);
  return to.data();
}

} // namespace

Gemm::~Gemm() = default;

void Gemm::run(const void* a, const void* b, void* c) const {
  if (!primitive_) { // an empty product: only k == 0 leaves elements to write, beta C (0 when beta is 0)
    const int64_t count = shape_.batch * shape_.m * shape_.n;
    if (shape_.k != 0 || count == 0)
      return;
    if (shape_.beta == 0.0) {
      std::memset(c, 0, static_cast<std::size_t>(count) * dtype_size(shape_.result));
    } else if (shape_.result == Dtype::f32) {
      for (float* v = static_cast<float*>(c); v != static_cast<float*>(c) + count; ++v)
        *v = static_cast<float>(shape_.beta) * *v;
    } else {
      for (bfloat16* v = static_cast<bfloat16*>(c); v != static_cast<bfloat16*>(c) + count; ++v)
        *v = bfloat16(static_cast<float>(shape_.beta) * static_cast<float>(*v));
    }
    return;
  }
  thread_local ThreadContext context;
  if (widened_) {
    run_widened(a, b, c, context);
    return;
  }
  execute(a, b, c, context);
}

// The bf16 operands (and a bf16 C) widened to f32 in the thread's buffers, the f32 product, then C rounded once.
void Gemm::run_widened(const void* a, const void* b, void* c, ThreadContext& context) const {
  const int64_t c_count = shape_.batch * shape_.m * shape_.n;
  if (shape_.operands == Dtype::bf16) {
    a = widened(a, shape_.batch * shape_.m * shape_.k, context.widened_a);
    b = widened(b, shape_.batch * shape_.k * shape_.n, context.widened_b);
  }
  if (shape_.result == Dtype::f32) {
    execute(a, b, c, context);
    return;
  }
  if (shape_.beta != 0.0)
    widened(c, c_count, context.widened_c);
  else
    context.widened_c.resize(static_cast<std::size_t>(c_count));
  execute(a, b, context.widened_c.data(), context);
  bfloat16* result = static_cast<bfloat16*>(c);
  for (int64_t i = 0; i < c_count; ++i)
    result[i] = bfloat16(context.widened_c[static_cast<std::size_t>(i)]);
}

void Gemm::execute(const void* a, const void* b, void* c, ThreadContext& context) const {
  const OneDnn& lib = onednn();
  if (!context.stream)
    check(lib, lib.dnnl_stream_create(&context.stream, lib.engine, dnnl_stream_default_flags), "dnnl_stream_create",
          shape_);
  const std::size_t scratch_bytes = lib.dnnl_memory_desc_get_size(&primitive_->scratchpad);
  if (context.scratchpad.size() < scratch_bytes)
    context.scratchpad.resize(scratch_bytes);
  // Memory objects are the library's handles on the caller's buffers: made for the run, freed after it.
  dnnl_exec_arg_t args[4] = {
      {DNNL_ARG_SRC, nullptr}, {DNNL_ARG_WEIGHTS, nullptr}, {DNNL_ARG_DST, nullptr}, {DNNL_ARG_SCRATCHPAD, nullptr}};
  const dnnl_memory_desc_t* descs[4] = {&primitive_->a, &primitive_->b, &primitive_->c, &primitive_->scratchpad};
  void* handles[4] = {const_cast<void*>(a), const_cast<void*>(b), c, context.scratchpad.data()};
  dnnl_status_t status = dnnl_success;
  int made = 0;
  for (; made < 4 && status == dnnl_success; ++made)
    status = lib.dnnl_memory_create(&args[made].memory, descs[made], lib.engine, handles[made]);
  if (status == dnnl_success)
    status = lib.dnnl_primitive_execute(primitive_->primitive, context.stream, 4, args);
  if (status == dnnl_success)
    status = lib.dnnl_stream_wait(context.stream);
  for (int i = 0; i < made; ++i)
    if (args[i].memory)
      lib.dnnl_memory_destroy(args[i].memory);
  check(lib, status, "dnnl_primitive_execute", shape_);
}

const Gemm& prepared_gemm(const GemmShape& shape) {
  static std::mutex mutex;
  static std::vector<std::unique_ptr<Gemm>>* prepared = new std::vector<std::unique_ptr<Gemm>>; // for the process
  std::lock_guard lock(mutex);
  for (const auto& gemm : *prepared)
    if (gemm->shape() == shape)
      return *gemm;
  return *prepared->emplace_back(std::make_unique<Gemm>(shape));
}

void probe_gemm_library(const std::string& library) {
  OneDnn lib;
  if (std::string failure = load(library, lib); !failure.empty())
    throw Error(failure);
}

bool gemm_library_available() {
  try {
    onednn();
    return true;
  } catch (const Error&) {
    return false;
  }
}

} // namespace optjit
