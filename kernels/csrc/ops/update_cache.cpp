// etfuse::update_cache.out and (runtime only) etfuse::update_cache_: a KV-cache write, self with
// the slices at `positions` along `dim` replaced by `values` (index_put(self, [None] * dim +
// [positions], values)). The in-place form is what `to_executorch` of a fused program runs on a
// mutable cache buffer: it writes only the new rows (backend_ops/cache_ops.py). Any dtype.
#include <cstring>

#include "adapter.h"

namespace {

using namespace etfuse::adapter;

// Shapes, dtypes and positions (checked and wrapped into [0, S)) of one call.
struct Write {
  int64_t outer = 1, S = 0, L = 0, row_bytes = 0;
  std::vector<int64_t> at;
};

bool check(const char* op, const Tensor& self, const Tensor& values, const Tensor& positions, int64_t dim,
           Layout& ls, Layout& lv, Write& w, Status& st) {
  Layout lp;
  bool ok = check_cpu(op, "self", self, st) && check_cpu(op, "values", values, st) &&
      check_cpu(op, "positions", positions, st) && layout_of(self, "self", ls, st) &&
      layout_of(values, "values", lv, st) && layout_of(positions, "positions", lp, st);
  if (!ok) return false;
  if (dim < 0 || dim >= ls.ndim) return st.fail("%s: dim %lld is not a dim of self %s", op, (long long)dim, etfuse::core::ShapeStr(ls).c_str());
  if (values.scalar_type() != self.scalar_type()) {
    return st.fail("%s: values has dtype %s, self %s", op, dtype_name(values.scalar_type()), dtype_name(self.scalar_type()));
  }
  if (positions.scalar_type() != ScalarType::Long || lp.ndim != 1) {
    return st.fail("%s: positions must be int64 [L], got %s %s", op, dtype_name(positions.scalar_type()),
                   etfuse::core::ShapeStr(lp).c_str());
  }
  w.L = lp.sizes[0];
  // values broadcast (as index_put's do) to the written slices: self's shape with L at dim
  Layout slices = ls;
  slices.sizes[dim] = w.L;
  bool fits = lv.ndim <= ls.ndim;
  for (int d = ls.ndim - 1, e = lv.ndim - 1; fits && d >= 0; --d, --e) {
    const int64_t size = e >= 0 ? lv.sizes[e] : 1;
    fits = size == slices.sizes[d] || size == 1;
    slices.strides[d] = e >= 0 && size == slices.sizes[d] ? lv.strides[e] : 0;
  }
  if (!fits) {
    return st.fail("%s: values %s do not broadcast to %lld slices of self %s at dim %lld", op,
                   etfuse::core::ShapeStr(lv).c_str(), (long long)w.L, etfuse::core::ShapeStr(ls).c_str(),
                   (long long)dim);
  }
  lv = slices;  // values read through the broadcast layout
  w.S = ls.sizes[dim];
  w.row_bytes = static_cast<int64_t>(element_size(self));
  for (int d = 0; d < ls.ndim; ++d) {
    if (d < dim) w.outer *= ls.sizes[d];
    if (d > dim) w.row_bytes *= ls.sizes[d];
  }
  const int64_t* pos = positions.const_data_ptr<int64_t>();
  w.at.resize(static_cast<size_t>(w.L));
  for (int64_t p = 0; p < w.L; ++p) {
    const int64_t i = pos[p * lp.strides[0]];
    if (i < -w.S || i >= w.S) {
      return st.fail("%s: position %lld is out of range for dim %lld of size %lld", op, (long long)i, (long long)dim,
                     (long long)w.S);
    }
    w.at[static_cast<size_t>(p)] = i < 0 ? i + w.S : i;
  }
  return true;
}

// dst: contiguous, self's shape; values read through `lv` (check's broadcast layout).
void scatter(const Write& w, char* dst, const Tensor& values, const Layout& lv) {
  Input v(values, lv);
  if (!is_contiguous(lv)) v.make_contiguous();
  const char* src = v.data<char>();
  for (int64_t o = 0; o < w.outer; ++o) {
    for (int64_t p = 0; p < w.L; ++p) {
      std::memcpy(dst + (o * w.S + w.at[static_cast<size_t>(p)]) * w.row_bytes, src + (o * w.L + p) * w.row_bytes,
                  static_cast<size_t>(w.row_bytes));
    }
  }
}

Tensor& update_cache_out(Context& ctx, const Tensor& self, const Tensor& values, const Tensor& positions, int64_t dim,
                         Tensor& out) {
  constexpr const char* op = "etfuse::update_cache.out";
  Status st;
  Layout ls, lv;
  Write w;
  bool ok = check(op, self, values, positions, dim, ls, lv, w, st);
  if (ok && out.scalar_type() != self.scalar_type()) {
    ok = st.fail("%s: out has dtype %s, self %s", op, dtype_name(out.scalar_type()), dtype_name(self.scalar_type()));
  }
  Out o(out);
  ok = ok && o.resize(op, ls.ndim, ls.sizes, st) && o.open({&values, &positions}, false, is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  char* dst = static_cast<char*>(o.raw());
  if (dst != self.const_data_ptr() || !is_contiguous(ls)) {  // out is not self already
    if (is_contiguous(ls)) {
      std::memcpy(dst, self.const_data_ptr(), static_cast<size_t>(ls.numel()) * element_size(self));
    } else {
      copy_strided(static_cast<const char*>(self.const_data_ptr()), ls, dst, element_size(self), false);
    }
  }
  scatter(w, dst, values, lv);
  return o.finish();
}

#if defined(ETFUSE_RUNTIME)
// The runtime passes the result (self, aliased) last.
Tensor& update_cache_inplace(Context& ctx, Tensor& self, const Tensor& values, const Tensor& positions, int64_t dim,
                             Tensor& out) {
  constexpr const char* op = "etfuse::update_cache_";
  Status st;
  Layout ls, lv;
  Write w;
  bool ok = check(op, self, values, positions, dim, ls, lv, w, st);
  if (ok && !is_contiguous(ls)) ok = st.fail("%s: self must be contiguous to be written in place", op);
  ETFUSE_CHECK(ctx, ok, st, out);
  scatter(w, static_cast<char*>(self.mutable_data_ptr()), values, lv);
  return out;
}
#endif

}  // namespace

ETFUSE_REGISTER(etfuse, "update_cache.out", update_cache_out);
#if defined(ETFUSE_RUNTIME)
ETFUSE_REGISTER(etfuse, "update_cache_", update_cache_inplace);
#endif
