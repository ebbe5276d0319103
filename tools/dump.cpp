// optjit dump: one stage of the code optjit generates for an optimizer configuration, as text.
#include "compiler/compiled_step.h"
#include "frontend/optim/registry.h"
#include "runtime/cuda_driver.h"
#include "runtime/error.h"
#include "tools/commands.h"
#include "tools/model.h"

#include <charconv>
#include <cstdio>

namespace optjit {
namespace {

double parse_number(const std::string& key, const std::string& text) {
  if (text == "true" || text == "True")
    return 1;
  if (text == "false" || text == "False")
    return 0;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size())
    throw Error("option " + key + "=" + text + ": expected a number, true/false or a pair like (0.9,0.99)");
  return value;
}

// "lr=0.01,amsgrad=true,betas=(0.8,0.9)" -> keyword options; commas inside parentheses separate a pair.
KeywordOptions parse_keyword_options(const std::string& text) {
  KeywordOptions options;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t eq = text.find('=', pos);
    if (eq == std::string::npos)
      throw Error("option '" + text.substr(pos) + "' in --set: write name=value");
    const std::string key = text.substr(pos, eq - pos);
    std::vector<double> values;
    std::size_t end;
    if (eq + 1 < text.size() && text[eq + 1] == '(') {
      end = text.find(')', eq);
      if (end == std::string::npos)
        throw Error("option " + key + " in --set: unclosed '('");
      std::string inner = text.substr(eq + 2, end - eq - 2);
      for (std::size_t b = 0; b <= inner.size();) {
        std::size_t c = std::min(inner.find(',', b), inner.size());
        values.push_back(parse_number(key, inner.substr(b, c - b)));
        b = c + 1;
      }
      ++end;
    } else {
      end = std::min(text.find(',', eq), text.size());
      values.push_back(parse_number(key, text.substr(eq + 1, end - eq - 1)));
    }
    options[key] = values;
    if (end < text.size() && text[end] != ',')
      throw Error("option " + key + " in --set: expected ',' after its value");
    pos = end + 1;
  }
  return options;
}

} // namespace

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
