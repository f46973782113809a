// The headers the runtime op files parse (adapter.h with -DETFUSE_RUNTIME: executorch's kernel
// headers; the op-layer headers over the GEMM and conv cores), precompiled once per build
// directory by ninja and forced into every runtime op file (-include): the first run of etfuse
// waits for the runtime library's build, and parsing these was about a third of each unit's time.
#pragma once

#include "adapter.h"
#include "ops/conv2d.h"
#include "ops/elementwise.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "ops/quantized_gemm.h"
