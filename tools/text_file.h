// Reading a whole input file as text, with the size limit the reader states (golden cases, IR files).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace optjit {

// The whole of `file`, at most `max_bytes` long (`limit` names that constant in the error). Throws optjit::Error
// "cannot read the <what> <file>: <reason>" or "the <what> <file> has N bytes, more than the largest, M bytes
// (<limit>)".
std::string read_text_file(const std::filesystem::path& file, const std::string& what, uintmax_t max_bytes,
                           const char* limit);

} // namespace optjit
