#include "tools/text_file.h"
#include "runtime/error.h"

#include <spdlog/fmt/fmt.h>

#include <fstream>
#include <iterator>

namespace optjit {

std::string read_text_file(const std::filesystem::path& file, const std::string& what, uintmax_t max_bytes,
                           const char* limit) {
  std::error_code error;
  const uintmax_t size = std::filesystem::file_size(file, error);
  if (error)
    throw Error(fmt::format("cannot read the {} {}: {}", what, file.string(), error.message()));
  if (size > max_bytes)
    throw Error(fmt::format("the {} {} has {} bytes, more than the largest, {} bytes ({})", what, file.string(), size,
                            max_bytes, limit));
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw Error(fmt::format("cannot read the {} {}", what, file.string()));
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

} // namespace optjit
