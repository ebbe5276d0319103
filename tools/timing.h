// Wall-clock timing for the CLI's measurements: medians over repeats, so one descheduled run does not count.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace optjit {

template <class Fn> double time_ms(Fn&& fn) {
  auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

template <class Fn> double median_ms(int repeats, Fn&& fn) {
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i)
    times.push_back(time_ms(fn));
  std::nth_element(times.begin(), times.begin() + static_cast<long>(times.size() / 2), times.end());
  return times[times.size() / 2];
}

} // namespace optjit
