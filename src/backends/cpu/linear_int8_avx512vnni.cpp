// The integer dot-product kernels (linear_int8_kernels.inc) with AVX512-VNNI's vpdpbusd on 256-bit
// registers (EVEX: Intel Ice Lake and later Xeons, AMD Zen 4, which lacks the VEX form); chosen
// at run time (Int8DotIsa).
#define KESTREL_INT8_NS avx512vnni
#define KESTREL_INT8_DPBUSD 2
#include "backends/cpu/linear_int8_kernels.inc"
