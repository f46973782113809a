// The compute-heavy core loops, compiled once per library instead of once per op file: the
// GEMM's per-ISA tile and dot-product kernels (gemm.h) and conv2d's window packer and depthwise
// kernels (conv2d.h, which includes core/conv2d/). No torch or executorch headers.
#define ETFUSE_CORE_KERNELS 1
#include "core/conv2d.h"
#include "core/attention.h"
#include "core/norm.h"
#include "core/linear_qw.h"
#include "core/linear_dq.h"
#include "core/gemm.h"
#include "core/int8_depthwise.h"
#include "core/int8_pointwise.h"
#include "core/pool2d.h"
