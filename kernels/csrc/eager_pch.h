// The torch headers of the eager build (adapter.h with -DETFUSE_EAGER), precompiled once per
// build directory by ninja and forced into every eager op file (-include): parsing them is most
// of an eager translation unit's compile time.
#pragma once

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
