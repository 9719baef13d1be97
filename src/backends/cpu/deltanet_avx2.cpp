// The gated delta rule (deltanet_rule.inc) built with AVX2 and FMA: the same bits as the baseline
// build in deltanet.cpp, its loops over independent elements eight floats wide.
#define KESTREL_DELTA_NS delta_avx2
#include "backends/cpu/deltanet_rule.inc"
