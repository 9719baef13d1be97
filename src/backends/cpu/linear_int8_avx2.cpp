// The integer dot-product kernels (linear_int8_kernels.inc) for AVX2: maddubs then madd.
#define KESTREL_INT8_NS avx2
#define KESTREL_INT8_DPBUSD 0
#include "backends/cpu/linear_int8_kernels.inc"
