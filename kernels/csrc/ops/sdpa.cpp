// etfuse::sdpa.out: scaled dot-product attention, softmax(scale * q @ k^T + mask) @ v, with an all-masked
// row giving 0 (core/attention.h). q, k, v and the mask are read through their strides.
#include "adapter.h"
#include "core/attention.h"

namespace {

using namespace etfuse::adapter;

bool rank4(const char* op, const char* name, const Layout& l, Status& st) {
  if (l.ndim == 4) return true;
  return st.fail("%s: %s must be 4-D [batch, heads, sequence, head_dim], got %s", op, name,
                 etfuse::core::ShapeStr(l).c_str());
}

// The mask's strides as [B, H, L, S]: it broadcasts from the right, 0 along size-1 dimensions.
bool mask_strides(const char* op, const Layout& lm, const int64_t* want, int64_t* strides, Status& st) {
  if (lm.ndim > 4) return st.fail("%s: mask has rank %d; at most 4", op, lm.ndim);
  for (int d = 0; d < 4; ++d) {
    const int md = lm.ndim - 4 + d;
    const int64_t size = md >= 0 ? lm.sizes[md] : 1;
    if (size != want[d] && size != 1) {
      return st.fail("%s: mask of shape %s does not broadcast to the scores [%lld, %lld, %lld, %lld]", op,
                     etfuse::core::ShapeStr(lm).c_str(), (long long)want[0], (long long)want[1], (long long)want[2],
                     (long long)want[3]);
    }
    strides[d] = md >= 0 && size != 1 ? lm.strides[md] : 0;
  }
  return true;
}

Tensor& sdpa_out(Context& ctx, const Tensor& query, const Tensor& key, const Tensor& value, const OptTensor& mask,
                 double scale, Tensor& out) {
  constexpr const char* op = "etfuse::sdpa.out";
  Status st;
  Layout lq, lk, lv, lm;
  etfuse::core::attention::Args a;
  Out o(out);
  bool ok = check_float(op, "query", query, st) && check_float(op, "key", key, st) &&
      check_float(op, "value", value, st) && check_float(op, "out", out, st) &&
      (!has(mask) || (check_float(op, "mask", *mask, st) && layout_of(*mask, "mask", lm, st))) &&
      layout_of(query, "query", lq, st) && layout_of(key, "key", lk, st) && layout_of(value, "value", lv, st) &&
      rank4(op, "query", lq, st) && rank4(op, "key", lk, st) && rank4(op, "value", lv, st);
  if (ok && (lk.sizes[0] != lq.sizes[0] || lk.sizes[1] == 0 || lq.sizes[1] % lk.sizes[1] != 0 ||
             lk.sizes[3] != lq.sizes[3] || lv.sizes[0] != lq.sizes[0] || lv.sizes[1] != lk.sizes[1] ||
             lv.sizes[2] != lk.sizes[2])) {
    ok = st.fail("%s: query %s, key %s and value %s do not fit: key must be [B, Hk, S, D] and value [B, Hk, S, Dv] "
                 "for query [B, H, L, D], Hk dividing H", op, etfuse::core::ShapeStr(lq).c_str(), etfuse::core::ShapeStr(lk).c_str(),
                 etfuse::core::ShapeStr(lv).c_str());
  }
  if (ok) {
    a.B = lq.sizes[0], a.H = lq.sizes[1], a.L = lq.sizes[2], a.D = lq.sizes[3], a.S = lk.sizes[2], a.Dv = lv.sizes[3];
    a.rep = a.H / lk.sizes[1];
    const int64_t scores[4] = {a.B, a.H, a.L, a.S};
    const int64_t sizes[4] = {a.B, a.H, a.L, a.Dv};
    ok = (!has(mask) || mask_strides(op, lm, scores, a.m_s, st)) && o.resize(op, 4, sizes, st);
  }
  // the core writes a contiguous out that overlaps no input
  ok = ok && o.open({&query, &key, &value, has(mask) ? &*mask : nullptr}, false,
                    o.layout().numel() == 0 || is_contiguous(o.layout()), st);
  ETFUSE_CHECK(ctx, ok, st, out);
  for (int d = 0; d < 4; ++d) a.q_s[d] = lq.strides[d], a.k_s[d] = lk.strides[d], a.v_s[d] = lv.strides[d];
  a.q = query.const_data_ptr<float>();
  a.k = key.const_data_ptr<float>();
  a.v = value.const_data_ptr<float>();
  a.mask = has(mask) ? mask->const_data_ptr<float>() : nullptr;
  a.scale = static_cast<float>(scale);
  a.out = o.data<float>();
  etfuse::core::attention::run(a, Parallel{});
  return o.finish();
}

}  // namespace

ETFUSE_REGISTER(etfuse, "sdpa.out", sdpa_out);
