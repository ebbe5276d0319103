#include "tools/cli_text.h"
#include "frontend/optim/options.h"
#include "runtime/error.h"

#include <charconv>

namespace optjit {

std::vector<Shape> parse_shape_list(const std::string& text) {
  std::vector<Shape> shapes;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    Shape shape;
    if (item != "scalar" && !item.empty()) {
      std::size_t pos = 0;
      while (pos <= item.size()) {
        std::size_t x = item.find('x', pos);
        std::string extent = item.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
        int64_t value = -1;
        auto [end, ec] = std::from_chars(extent.data(), extent.data() + extent.size(), value);
        if (ec != std::errc() || end != extent.data() + extent.size() || value < 0)
          throw Error("bad shape '" + item + "' in '" + text + "': write extents as NxM, e.g. 10x10");
        shape.push_back(value);
        if (x == std::string::npos)
          break;
        pos = x + 1;
      }
    }
    shapes.push_back(shape);
    if (comma == std::string::npos)
      break;
    start = comma + 1;
  }
  return shapes;
}

static double parse_number(const std::string& key, const std::string& text) {
  if (text == "true" || text == "True")
    return 1;
  if (text == "false" || text == "False")
    return 0;
  double value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() && option_takes_names(key))
    return named_option_value(key, text); // a choice by name (state_dtype=int8, adjust_lr_fn=original)
  if (ec != std::errc() || end != text.data() + text.size())
    throw Error("option " + key + "=" + text + ": expected a number, true/false or a pair like (0.9,0.99)");
  return value;
}

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
    if (!options.emplace(key, values).second)
      throw Error("option " + key + " in --set: given twice");
    if (end < text.size() && text[end] != ',')
      throw Error("option " + key + " in --set: expected ',' after its value");
    pos = end + 1;
  }
  return options;
}

} // namespace optjit
