"""The Triton kernels (device code). Imported only where `triton` is installed.

One kernel per backend op family; the host-side launchers (grid, block sizes, broadcast
strides, validation) are in `launch.py`. Conventions shared by every kernel:

* offsets are int64 (a program id is widened before it is scaled), so tensors past 2**31
  elements index correctly;
* element-wise kernels read each operand through up to four broadcast strides (`_bcast_offset`,
  dims collapsed on the host) unless `CONTIG` says every operand is one contiguous run;
* float arithmetic happens in float32 and is rounded once to the output dtype, like torch's
  CUDA kernels (float16/bfloat16 inputs are upcast, the result is rounded to nearest even);
* the quantized kernels are launched with `enable_fp_fusion=False` (no FMA contraction) and
  round half to even with the 1.5 * 2**23 trick (`_rint`), so each step is the same float32
  operation as the C++ kernels (`kernels/csrc/core/quantized.h`) and torch.ao's decomposed ops.
  (`libdevice.rint` would be one instruction on the GPU but does not run in the interpreter.)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bcast_offset(i, s1, s2, s3, t0, t1, t2, t3):
    """Element offset of flat output index `i` (dims [s0, s1, s2, s3], innermost last) in an
    operand with strides t0..t3 (0 where it is broadcast)."""
    i3 = i % s3
    r = i // s3
    i2 = r % s2
    r = r // s2
    i1 = r % s1
    i0 = r // s1
    return i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3


@triton.jit
def add_relu_kernel(
    a_ptr, b_ptr, o_ptr, n,
    s1, s2, s3,
    sa0, sa1, sa2, sa3,
    sb0, sb1, sb2, sb3,
    CONTIG: tl.constexpr, BLOCK: tl.constexpr,
):
    """o = relu(a + b) over `n` output elements (o contiguous); NaN stays NaN like torch.relu."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    if CONTIG:
        oa = i
        ob = i
    else:
        oa = _bcast_offset(i, s1, s2, s3, sa0, sa1, sa2, sa3)
        ob = _bcast_offset(i, s1, s2, s3, sb0, sb1, sb2, sb3)
    a = tl.load(a_ptr + oa, mask=mask).to(tl.float32)
    b = tl.load(b_ptr + ob, mask=mask).to(tl.float32)
    s = a + b
    r = tl.where(s < 0.0, 0.0, s)
    tl.store(o_ptr + i, r.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rint(v):
    """Round half to even for float32 `v` in float32 arithmetic. Exact for |v| <= 2**22; the
    callers clamp to that range first (the result is clamped to a quant range after anyway)."""
    return (v + 12582912.0) - 12582912.0


@triton.jit
def quantized_add_kernel(
    a_ptr, b_ptr, o_ptr, n,
    s1, s2, s3,
    sa0, sa1, sa2, sa3,
    sb0, sb1, sb2, sb3,
    a_scale, a_zp, b_scale, b_zp, inv_out_scale, out_zp, qmin, qmax,
    RELU: tl.constexpr, CONTIG: tl.constexpr, BLOCK: tl.constexpr,
):
    """o = clamp(rint(s * inv_out_scale) + out_zp, qmin, qmax), s = dq(a) + dq(b) [relu'd];
    dq(q) = (float(q) - zp) * scale. Every scalar argument is float32."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    if CONTIG:
        oa = i
        ob = i
    else:
        oa = _bcast_offset(i, s1, s2, s3, sa0, sa1, sa2, sa3)
        ob = _bcast_offset(i, s1, s2, s3, sb0, sb1, sb2, sb3)
    qa = tl.load(a_ptr + oa, mask=mask, other=0).to(tl.float32)
    qb = tl.load(b_ptr + ob, mask=mask, other=0).to(tl.float32)
    x = (qa - a_zp) * a_scale
    y = (qb - b_zp) * b_scale
    s = x + y
    if RELU:
        s = tl.where(s < 0.0, 0.0, s)
    v = s * inv_out_scale
    v = tl.where(v < -4194304.0, -4194304.0, v)
    v = tl.where(v > 4194304.0, 4194304.0, v)
    r = _rint(v) + out_zp
    r = tl.where(r < qmin, qmin, r)
    r = tl.where(r > qmax, qmax, r)
    tl.store(o_ptr + i, r.to(tl.int32).to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def addmm_relu_kernel(
    a_ptr, b_ptr, bias_ptr, c_ptr,
    M, N, K,
    s_am, s_ak, s_bk, s_bn, s_biasm, s_biasn, s_cm, s_cn,
    HAS_BIAS: tl.constexpr, EVEN_K: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    """c[M, N] = relu(a[M, K] @ b[K, N] + bias), every operand read through its strides (linear's
    weight [N, K] is b with swapped strides; a broadcast bias has stride 0). float32 accumulator;
    bias and relu in the epilogue; programs grouped by GROUP_M rows of tiles for L2 reuse."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    rm = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    # Rows/columns past the edge read a valid row/column (wrapped) and are never stored.
    ram = rm % M
    rbn = rn % N
    a_ptrs = a_ptr + ram[:, None] * s_am + rk[None, :] * s_ak
    b_ptrs = b_ptr + rk[:, None] * s_bk + rbn[None, :] * s_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * s_ak
        b_ptrs += BLOCK_K * s_bk

    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + rm[:, None] * s_biasm + rn[None, :] * s_biasn, mask=mask, other=0.0)
        acc = acc + bias.to(tl.float32)
    acc = tl.where(acc < 0.0, 0.0, acc)
    tl.store(c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def embedding_byte_kernel(
    w_ptr, scale_ptr, zp_ptr, idx_ptr, o_ptr,
    n_idx, rows, D, s_w0, s_w1,
    HAS_ZP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """o[i, :] = ((float(w[idx[i], :]) - float(zp[idx[i]])) * float(scale[idx[i]])) rounded once to
    o's dtype. scale (float32/float16) and zp (any int or float dtype) are read per row in their
    own dtype and converted here, like the pattern's `_to_copy(..., float32)`. An index outside
    [0, rows) reads nothing (its row is written as 0); the launcher checks indices on the host
    where that costs no device sync."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.program_id(1).to(tl.int64) * BLOCK_D + tl.arange(0, BLOCK_D)
    rmask = r < n_idx
    idx = tl.load(idx_ptr + r, mask=rmask, other=0).to(tl.int64)
    valid = rmask & (idx >= 0) & (idx < rows)
    dmask = d < D
    s = tl.load(scale_ptr + idx, mask=valid, other=0.0).to(tl.float32)
    q = tl.load(w_ptr + idx[:, None] * s_w0 + d[None, :] * s_w1, mask=valid[:, None] & dmask[None, :], other=0)
    v = q.to(tl.float32)
    if HAS_ZP:
        z = tl.load(zp_ptr + idx, mask=valid, other=0).to(tl.float32)
        v = v - z[:, None]
    v = v * s[:, None]
    tl.store(o_ptr + r[:, None] * D + d[None, :], v.to(o_ptr.dtype.element_ty), mask=rmask[:, None] & dmask[None, :])

