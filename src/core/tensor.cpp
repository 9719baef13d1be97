#include "core/tensor.h"

namespace kestrel {

std::string ShapeString(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.n_dims; ++i) {
    if (i) s += ", ";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

}  // namespace kestrel
