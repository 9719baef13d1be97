// The integer dot-product kernels (linear_int8_kernels.inc) with AVX-VNNI's vpdpbusd (VEX: Intel
// from Alder Lake and Sapphire Rapids, AMD from Zen 5); chosen at run time (Int8DotIsa).
#define KESTREL_INT8_NS avxvnni
#define KESTREL_INT8_DPBUSD 1
#include "backends/cpu/linear_int8_kernels.inc"
