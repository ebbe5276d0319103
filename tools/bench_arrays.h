// What optjit bench measures a compiled step against: the arrays its kernels touch per element, at their storage
// widths, for a traffic probe of the same bytes (tools/traffic_probe.h).
#pragma once

#include "frontend/optim/optimizer.h"
#include "tools/traffic_probe.h"

#include <vector>

namespace optjit {

// Every tensor slot each kernel of `bucket`'s compiled step touches per element (scratch matrices a kernel hands to
// the matrix library included): a plan of several kernels pays every pass. Rows and columns are left out (one value
// per row or column, not per element).
std::vector<TrafficProbe::Array> arrays_of(const Optimizer& opt, const ParamBucket& bucket);

} // namespace optjit
