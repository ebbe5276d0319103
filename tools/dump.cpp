// optjit dump: one stage of the code optjit generates for an optimizer configuration, as text.
#include "compiler/compiled_step.h"
#include "frontend/optim/registry.h"
#include "runtime/cuda/cuda_driver.h"
#include "runtime/error.h"
#include "tools/cli_text.h"
#include "tools/commands.h"
#include "tools/model.h"

#include <cstdio>

namespace optjit {
int run_dump(const DumpOptions& o) {
  const Stage stage = parse_stage(o.stage);
  std::vector<Tensor> params = random_params(parse_shape_list(o.params), o.dtype, 0);
  // GPU code needs no GPU: without one the params stay on the CPU and the same kernel plans are lowered for sm.
  const bool gpu = o.device.kind == DeviceKind::cuda || stage == Stage::PTX;
  const bool params_on_gpu = o.device.kind == DeviceKind::cuda && cuda::available();
  if (params_on_gpu)
    for (Tensor& p : params)
      p = p.to(o.device);
  KeywordOptions options = parse_keyword_options(o.set);
  options.try_emplace("foreach", std::vector<double>{1});
  auto opt = make_optimizer(o.optimizer, {ParamGroupSpec{params, {}}}, options);
  CompiledStep step = compile(*opt);
  const int sm = o.sm ? o.sm : (gpu && !params_on_gpu) ? 80 : 0;
  std::fputs(step.dump(stage, sm).c_str(), stdout);
  return 0;
}

} // namespace optjit
