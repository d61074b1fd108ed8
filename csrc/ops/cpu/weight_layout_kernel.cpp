// CPU implementation of the weight layout ops: spconv's weight [Cout, *kernel, Cin/groups] <-> the native
// route's filters [kvol, groups, Cin/groups, Cout/groups] (native/weight_layout.h), the filters in output-cache
// memory. Any dtype of 1, 2, 4 or 8 bytes: the elements are moved, never converted.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../../native/weight_layout.h"
#include "../output_cache.h"

namespace spconv {
namespace ops {
namespace {

void check_element_size(const at::Tensor& t, const char* name) {
  const int64_t e = t.element_size();
  TORCH_CHECK_VALUE(e == 1 || e == 2 || e == 4 || e == 8, name, ": dtype ", t.scalar_type(),
                    " is not supported (elements of 1, 2, 4 or 8 bytes)");
}

at::Tensor weight_to_filters_cpu(const at::Tensor& weight, int64_t groups) {
  TORCH_CHECK_VALUE(weight.dim() >= 3, "weight must be [Cout, *kernel_size, Cin/groups] (3 or more dims), got shape ",
                    weight.sizes());
  check_element_size(weight, "weight");
  TORCH_CHECK_VALUE(groups >= 1, "groups must be >= 1, got ", groups);
  const int64_t cout = weight.size(0), cig = weight.size(-1);
  TORCH_CHECK_VALUE(cout % groups == 0, "weight: Cout (", cout, ") must be divisible by groups (", groups, ")");
  int64_t kvol = 1;
  for (int64_t d = 1; d + 1 < weight.dim(); ++d) kvol *= weight.size(d);
  const int64_t cog = cout / groups;
  const at::Tensor w = weight.contiguous();
  at::Tensor filters = empty_output({kvol, groups, cig, cog}, w.options());
  if (filters.numel() > 0)
    native::weight_to_filters(w.const_data_ptr(), groups, cog, kvol, cig, filters.mutable_data_ptr(),
                              w.element_size());
  return filters;
}

at::Tensor filters_to_weight_cpu(const at::Tensor& filters, at::IntArrayRef kernel_size) {
  TORCH_CHECK_VALUE(filters.dim() == 4, "filters must be [kvol, groups, Cin/groups, Cout/groups], got shape ",
                    filters.sizes());
  check_element_size(filters, "filters");
  TORCH_CHECK_VALUE(!kernel_size.empty(), "kernel_size must have at least one entry");
  int64_t kvol = 1;
  for (int64_t k : kernel_size) {
    TORCH_CHECK_VALUE(k >= 1, "kernel_size entries must be >= 1, got ", kernel_size);
    kvol *= k;
  }
  TORCH_CHECK_VALUE(kvol == filters.size(0), "kernel_size ", kernel_size, " has volume ", kvol,
                    ", but filters has ", filters.size(0), " offsets");
  const int64_t groups = filters.size(1), cig = filters.size(2), cog = filters.size(3);
  std::vector<int64_t> sizes{groups * cog};
  sizes.insert(sizes.end(), kernel_size.begin(), kernel_size.end());
  sizes.push_back(cig);
  const at::Tensor f = filters.contiguous();
  at::Tensor weight = empty_output(sizes, f.options());
  if (weight.numel() > 0)
    native::filters_to_weight(f.const_data_ptr(), groups, cog, kvol, cig, weight.mutable_data_ptr(),
                              f.element_size());
  return weight;
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("weight_to_filters", &weight_to_filters_cpu);
  m.impl("filters_to_weight", &filters_to_weight_cpu);
}

}  // namespace ops
}  // namespace spconv
