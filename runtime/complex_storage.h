// complex64 and complex128 as storage types: an interleaved (real, imaginary) pair of components. optjit never
// computes on complex numbers: it steps a complex tensor on its real view (Tensor::view_as_real: the same memory as
// a tensor of the component dtype with a trailing dimension of 2), which is exactly what torch's optimizers do
// (`torch.view_as_real` on every complex param, grad and state tensor). So these types only hold bytes.
#pragma once

#include <type_traits>

namespace optjit {

template <class Component> struct complex_pair { Component re = 0, im = 0; };

using complex64 = complex_pair<float>;
using complex128 = complex_pair<double>;

template <class T> inline constexpr bool is_complex_storage_v = false;
template <class C> inline constexpr bool is_complex_storage_v<complex_pair<C>> = true;

static_assert(sizeof(complex64) == 8 && sizeof(complex128) == 16 && std::is_trivially_copyable_v<complex128>);

} // namespace optjit
