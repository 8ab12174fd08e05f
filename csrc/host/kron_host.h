// Host-side orchestration of the Kronecker-eigenbasis ops, shared by the CPU and
// CUDA backends (torch headers; not for device code).  The matrix products are
// ATen calls (bmm_out / mm_out into preallocated buffers, so on either device
// they go to the vendor BLAS); the elementwise passes are the backend's fused
// kernels over the math of vmfdist/kron.h, passed in as `Backend`:
//
//   struct Backend {
//     // t (rows * in elements, contiguous) *= s^p, s the contiguous scale whose
//     // batch entry b starts at offs(b), rows grouped as (batch, out):
//     static void scale_mul(at::Tensor& t, const at::Tensor& s, const kron::BatchOffsets& offs,
//                           int64_t out, int64_t in, double power);
//     // the seed interface (CpuSeeds, host/random_state.h, or CudaSeeds): Seed is how
//     // the kernels receive [seed, offset] (CPU: the values; CUDA: a device pointer)
//     // z (rows * in, contiguous) = E * s^p, E the Philox noise of kron.h:
//     static void noise(at::Tensor& z, const at::Tensor& s, const kron::BatchOffsets& offs,
//                       int64_t out, int64_t in, const Seed& seed_offset, double power);
//   };
//
// Memory: kron_eigen_matvec allocates the output and one buffer of the same
// size (Q_out^T V -> buf, buf Q_in -> out, out *= s^p, Q_out out -> buf,
// buf Q_in^T -> out); kron_eigen_sample likewise (noise -> out, Q_out out -> buf,
// buf Q_in^T -> out, out += loc).  Bases shared by the whole batch (2-D q_out or
// q_in) are never copied: a left product is one strided-batched GEMM over a
// stride-0 view of the basis, a right product one GEMM over the folded
// (batch * out, in) matrix.  kron::Ops<Backend> at the end are the operators themselves,
// registered by both backends.
#pragma once

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "host/tensor_checks.h"
#include "vmfdist/kron.h"
#include "vmfdist/philox.h"

namespace vmfdist {
namespace kron {

inline std::vector<int64_t> batch_of(const at::Tensor& t) {
  return std::vector<int64_t>(t.sizes().begin(), t.sizes().end() - 2);
}

inline int64_t prod(at::IntArrayRef s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

// Broadcast of the batch shapes of the named operands (all at least 2-D), with an
// error naming them when they do not broadcast.
inline std::vector<int64_t> broadcast_batch(const char* op, std::initializer_list<std::pair<const char*, at::Tensor>> ts) {
  std::vector<int64_t> shape;
  std::string names;
  for (const auto& [name, t] : ts) {
    const auto b = batch_of(t);
    try {
      shape = at::infer_size(shape, b);
    } catch (const c10::Error&) {
      TORCH_CHECK(false, op, ": the batch shape ", at::IntArrayRef(b), " of ", name,
                  " does not broadcast with the batch shape ", at::IntArrayRef(shape), " of ", names);
    }
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  return shape;
}

// Common floating dtype of the operands (an error for integer or complex ones).
inline at::ScalarType common_float_dtype(const char* op, std::initializer_list<std::pair<const char*, at::Tensor>> ts) {
  std::optional<at::ScalarType> dt;
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(at::isFloatingType(t.scalar_type()), op, ": ", name, " must be a floating tensor, got dtype ",
                t.scalar_type());
    dt = dt ? at::promote_types(*dt, t.scalar_type()) : t.scalar_type();
  }
  return *dt;
}

// Offsets of the batch entries of `s` (contiguous, shape (sb..., out, in) with sb
// broadcastable to `batch`) for the row-major batch index of `batch`; nullopt
// when more than kMaxDims dimensions remain after coalescing.
inline std::optional<BatchOffsets> batch_offsets(const at::Tensor& s, at::IntArrayRef batch) {
  const int64_t nb = static_cast<int64_t>(batch.size());
  const int64_t sb = s.dim() - 2;
  std::vector<int64_t> size, stride;
  for (int64_t k = 0; k < nb; ++k) {
    const int64_t ks = k - (nb - sb);  // matching dimension of s, if any
    const int64_t st = (ks >= 0 && s.size(ks) != 1) ? s.stride(ks) : 0;
    if (batch[k] == 1) continue;
    if (!size.empty() && stride.back() == st * batch[k]) {  // merge with the outer dimension
      size.back() *= batch[k];
      stride.back() = st;
    } else {
      size.push_back(batch[k]);
      stride.push_back(st);
    }
  }
  if (size.size() > static_cast<size_t>(kMaxDims)) return std::nullopt;
  BatchOffsets o;
  o.ndim = static_cast<int>(size.size());
  for (int k = 0; k < o.ndim; ++k) {
    o.size[k] = size[k];
    o.stride[k] = stride[k];
  }
  return o;
}

// The contiguous scale (or variance) with trailing dimensions (out, in), and its
// batch offsets over `batch` (materialised over the whole batch in the rare case
// of more than kMaxDims uncoalescable dimensions).
inline std::pair<at::Tensor, BatchOffsets> prepare_scale(const at::Tensor& s_in, at::ScalarType dt, at::IntArrayRef batch,
                                                         int64_t out, int64_t in) {
  std::vector<int64_t> shape = batch_of(s_in);
  shape.push_back(out);
  shape.push_back(in);
  at::Tensor s = s_in.to(dt).expand(shape).contiguous();
  if (auto o = batch_offsets(s, batch)) return {s, *o};
  std::vector<int64_t> full(batch.begin(), batch.end());
  full.push_back(out);
  full.push_back(in);
  s = s.expand(full).contiguous();
  return {s, *batch_offsets(s, batch)};
}

// (N, r, c) view (or, if the operand is broadcast over part of the batch, copy)
// of an operand broadcast to batch + (r, c).
inline at::Tensor as_batched(const at::Tensor& t, at::IntArrayRef batch, int64_t n) {
  std::vector<int64_t> shape(batch.begin(), batch.end());
  shape.push_back(t.size(-2));
  shape.push_back(t.size(-1));
  return t.expand(shape).reshape({n, t.size(-2), t.size(-1)});
}

// ---- checks ------------------------------------------------------------------

// Every tensor of `ts` has the dtype of `ref` (named `ref_name`).
inline void check_same_dtype(const char* op, const char* ref_name, const at::Tensor& ref,
                             std::initializer_list<std::pair<const char*, at::Tensor>> ts) {
  for (const auto& [name, t] : ts) {
    TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " must have the dtype of ", ref_name, " (",
                ref.scalar_type(), "), got ", t.scalar_type());
  }
}

inline void check_matrix(const char* op, const char* name, const at::Tensor& t, int64_t rows, int64_t cols,
                         const char* what) {
  TORCH_CHECK(t.dim() >= 2, op, ": ", name, " must have at least 2 dimensions (", what, "), got shape ", t.sizes());
  TORCH_CHECK(t.size(-2) == rows && t.size(-1) == cols, op, ": ", name, " must have trailing shape (", rows, ", ",
              cols, ") (", what, "), got shape ", t.sizes());
}

// scale / variance: trailing shape (out, in), or broadcastable to it (dimensions of size 1).
inline void check_bcast_matrix(const char* op, const char* name, const at::Tensor& t, int64_t rows, int64_t cols,
                               const char* what) {
  TORCH_CHECK(t.dim() >= 2, op, ": ", name, " must have at least 2 dimensions (", what, "), got shape ", t.sizes());
  TORCH_CHECK((t.size(-2) == rows || t.size(-2) == 1) && (t.size(-1) == cols || t.size(-1) == 1), op, ": ", name,
              " must have trailing shape (", rows, ", ", cols, ") or one that broadcasts to it (", what,
              "), got shape ", t.sizes());
}

inline void check_noise_range(const char* op, int64_t rows, int64_t in) {
  TORCH_CHECK(rows < philox::kMaxIndex, op, ": the noise must have fewer than 2^48 rows, got ", rows);
  TORCH_CHECK(in <= (int64_t(1) << 33), op, ": the last dimension must be at most 2^33, got ", in);
}

// ---- the ops -------------------------------------------------------------------

// The common case of one matrix (no batch dimensions, one dtype, a full (out, in) scale):
// plain GEMMs on the 2-D operands, none of the batch set-up (on small layers that set-up
// costs several times the arithmetic).
inline bool is_plain_2d(at::ScalarType dt, std::initializer_list<at::Tensor> ts, const at::Tensor& scale, int64_t out,
                        int64_t in) {
  for (const auto& t : ts) {
    if (t.dim() != 2 || t.scalar_type() != dt) return false;
  }
  return scale.dim() == 2 && scale.scalar_type() == dt && scale.size(0) == out && scale.size(1) == in;
}

// res (out, in) = Q_out ((Q_out^T V Q_in) * scale^power) Q_in^T, all operands 2-D of one
// dtype, scale contiguous (out, in); res contiguous (out, in), not aliasing an input.
template <class Backend>
void eigen_scale_2d(at::Tensor& res, const at::Tensor& q_out, const at::Tensor& q_in, const at::Tensor& scale,
                    const at::Tensor& v, double power) {
  const int64_t out = v.size(0), in = v.size(1);
  at::Tensor buf = at::empty({out, in}, res.options());
  at::mm_out(buf, q_out.mT(), v);  // Q_out^T V
  at::mm_out(res, buf, q_in);      // (Q_out^T V) Q_in
  Backend::scale_mul(res, scale, BatchOffsets{}, out, in, power);
  at::mm_out(buf, q_out, res);     // Q_out (...)
  at::mm_out(res, buf, q_in.mT());  // (...) Q_in^T
}


// out (N, out, in) = x (N, out, in) @ q (q 2-D: one GEMM over the folded rows).
inline void right_mul(at::Tensor& dst, const at::Tensor& x, const at::Tensor& q2d_or_q3) {
  if (q2d_or_q3.dim() == 2) {
    at::Tensor dst2 = dst.view({-1, q2d_or_q3.size(1)});
    at::mm_out(dst2, x.reshape({-1, x.size(-1)}), q2d_or_q3);
  } else {
    at::bmm_out(dst, x, q2d_or_q3);
  }
}

// out (N, out, in) = q (N, out, out) @ x (N, out, in).
inline void left_mul(at::Tensor& dst, const at::Tensor& q3, const at::Tensor& x) { at::bmm_out(dst, q3, x); }

template <class Backend>
at::Tensor kron_eigen_matvec_impl(const at::Tensor& q_out_in, const at::Tensor& q_in_in, const at::Tensor& scale_in,
                                  const at::Tensor& v_in, double power) {
  constexpr const char* op = "kron_eigen_matvec";
  TORCH_CHECK(v_in.dim() >= 2, op, ": v must have shape (..., out, in), got ", v_in.sizes());
  const int64_t out = v_in.size(-2), in = v_in.size(-1);
  check_matrix(op, "q_out", q_out_in, out, out, "the out x out eigenbasis, out = v.size(-2)");
  check_matrix(op, "q_in", q_in_in, in, in, "the in x in eigenbasis, in = v.size(-1)");
  check_bcast_matrix(op, "scale", scale_in, out, in, "the eigenvalues, like v");
  TORCH_CHECK(std::isfinite(power), op, ": power must be finite, got ", power);
  check_same_device(op, {{"v", v_in}, {"q_out", q_out_in}, {"q_in", q_in_in}, {"scale", scale_in}});
  const at::ScalarType dt =
      common_float_dtype(op, {{"v", v_in}, {"q_out", q_out_in}, {"q_in", q_in_in}, {"scale", scale_in}});
  const std::vector<int64_t> batch =
      broadcast_batch(op, {{"v", v_in}, {"q_out", q_out_in}, {"q_in", q_in_in}, {"scale", scale_in}});
  const int64_t n = prod(batch);
  std::vector<int64_t> shape = batch;
  shape.push_back(out);
  shape.push_back(in);
  const auto opts = v_in.options().dtype(dt);
  if (n * out * in == 0) return at::zeros(shape, opts);
  if (is_plain_2d(dt, {v_in, q_out_in, q_in_in}, scale_in, out, in)) {
    at::Tensor res = at::empty({out, in}, opts);
    eigen_scale_2d<Backend>(res, q_out_in, q_in_in, scale_in.contiguous(), v_in, power);
    return res;
  }

  const at::Tensor v = as_batched(v_in.to(dt), batch, n);
  const at::Tensor qo = as_batched(q_out_in.to(dt), batch, n);
  const at::Tensor qi = q_in_in.dim() == 2 ? q_in_in.to(dt) : as_batched(q_in_in.to(dt), batch, n);
  const auto [s, offs] = prepare_scale(scale_in, dt, batch, out, in);

  at::Tensor buf = at::empty({n, out, in}, opts);
  at::Tensor res = at::empty({n, out, in}, opts);
  left_mul(buf, qo.mT(), v);   // Q_out^T V
  right_mul(res, buf, qi);     // (Q_out^T V) Q_in
  Backend::scale_mul(res, s, offs, out, in, power);
  left_mul(buf, qo, res);      // Q_out (...)
  right_mul(res, buf, qi.mT());  // (...) Q_in^T
  return res.view(shape);
}

// The size and variance of kron_eigen_noise / kron_eigen_noise_keyed: (out, in) of the last two
// dimensions of `size`; variance floating and broadcasting to `size`; power finite.
inline std::pair<int64_t, int64_t> check_noise_args(const char* op, const at::Tensor& variance, at::IntArrayRef size,
                                                    double power) {
  TORCH_CHECK(size.size() >= 2, op, ": size must have at least 2 dimensions (..., out, in), got ", size);
  for (const int64_t x : size) TORCH_CHECK(x >= 0, op, ": size must be non-negative, got ", size);
  TORCH_CHECK(variance.dim() >= 2, op, ": variance must have at least 2 dimensions, got shape ", variance.sizes());
  TORCH_CHECK(at::isFloatingType(variance.scalar_type()), op, ": variance must be a floating tensor, got dtype ",
              variance.scalar_type());
  TORCH_CHECK(std::isfinite(power), op, ": power must be finite, got ", power);
  bool ok = variance.dim() <= static_cast<int64_t>(size.size());
  for (int64_t k = 1; ok && k <= variance.dim(); ++k) {
    const int64_t a = variance.size(-k), b = size[size.size() - k];
    ok = (a == b || a == 1);
  }
  TORCH_CHECK(ok, op, ": variance of shape ", variance.sizes(), " does not broadcast to size ", size);
  return {size[size.size() - 2], size[size.size() - 1]};
}

// `seed_offset` is the backend's view of the pair (Backend::Seed: the values on the CPU,
// a pointer to the device tensor on CUDA), checked by the caller.
template <class Backend>
at::Tensor kron_eigen_noise_impl(const at::Tensor& variance, at::IntArrayRef size,
                                 const typename Backend::Seed& seed_offset, double power) {
  constexpr const char* op = "kron_eigen_noise";
  const auto [out, in] = check_noise_args(op, variance, size, power);
  const at::IntArrayRef prefix = size.slice(0, size.size() - 2);
  check_noise_range(op, prod(prefix) * out, in);
  at::Tensor z = at::empty(size, variance.options());
  if (z.numel() == 0) return z;
  const auto [s, offs] = prepare_scale(variance, variance.scalar_type(), prefix, out, in);
  Backend::noise(z, s, offs, out, in, seed_offset, power);
  return z;
}

// kron_eigen_noise_keyed: one (seed, offset) per matrix of the leading dimensions, rows counted
// within each matrix.  `keys` is the contiguous (m, 2) int64 tensor, checked here (on the CPU its
// values too; on CUDA they are read only by the kernel, which masks the offset to 48 bits).
template <class Backend>
at::Tensor kron_eigen_noise_keyed_impl(const at::Tensor& variance, at::IntArrayRef size, const at::Tensor& keys_in,
                                       double power) {
  constexpr const char* op = "kron_eigen_noise_keyed";
  const auto [out, in] = check_noise_args(op, variance, size, power);
  const at::IntArrayRef prefix = size.slice(0, size.size() - 2);
  const int64_t m = prod(prefix);
  TORCH_CHECK(keys_in.scalar_type() == at::kLong && keys_in.dim() == 2 && keys_in.size(0) == m && keys_in.size(1) == 2,
              op, ": seed_offsets must be an int64 tensor of shape (", m, ", 2) (one [seed, offset] per matrix of size ",
              size, "), got dtype ", keys_in.scalar_type(), " and shape ", keys_in.sizes());
  check_same_device(op, {{"variance", variance}, {"seed_offsets", keys_in}});
  check_noise_range(op, out, in);
  at::Tensor z = at::empty(size, variance.options());
  if (z.numel() == 0) return z;
  const at::Tensor keys = keys_in.contiguous();
  Backend::check_keys(op, keys);
  const auto [s, offs] = prepare_scale(variance, variance.scalar_type(), prefix, out, in);
  Backend::noise_keyed(z, s, offs, out, in, keys.const_data_ptr<int64_t>(), power);
  return z;
}

// Returns the samples; the noise comes from `seed_offset` (see kron_eigen_noise_impl).
template <class Backend>
at::Tensor kron_eigen_sample_impl(const at::Tensor& loc_in, const at::Tensor& q_out_in, const at::Tensor& q_in_in,
                                  const at::Tensor& variance_in, int64_t num_samples,
                                  const typename Backend::Seed& seed_offset) {
  constexpr const char* op = "kron_eigen_sample";
  TORCH_CHECK(loc_in.dim() >= 2, op, ": loc must have shape (..., out, in), got ", loc_in.sizes());
  const int64_t out = loc_in.size(-2), in = loc_in.size(-1);
  check_matrix(op, "q_out", q_out_in, out, out, "the out x out eigenbasis, out = loc.size(-2)");
  check_matrix(op, "q_in", q_in_in, in, in, "the in x in eigenbasis, in = loc.size(-1)");
  check_bcast_matrix(op, "variance", variance_in, out, in, "the eigenvalues, like loc");
  TORCH_CHECK(num_samples >= 0, op, ": num_samples must be non-negative, got ", num_samples);
  check_same_device(op, {{"loc", loc_in}, {"q_out", q_out_in}, {"q_in", q_in_in}, {"variance", variance_in}});
  const at::ScalarType dt = common_float_dtype(
      op, {{"loc", loc_in}, {"q_out", q_out_in}, {"q_in", q_in_in}, {"variance", variance_in}});
  const std::vector<int64_t> batch = broadcast_batch(
      op, {{"loc", loc_in}, {"q_out", q_out_in}, {"q_in", q_in_in}, {"variance", variance_in}});
  const int64_t n = prod(batch);
  std::vector<int64_t> shape{num_samples};
  shape.insert(shape.end(), batch.begin(), batch.end());
  shape.push_back(out);
  shape.push_back(in);
  const auto opts = loc_in.options().dtype(dt);
  const int64_t m = num_samples * n;  // matrices in the output
  TORCH_CHECK(n == 0 || num_samples <= philox::kMaxIndex / n, op, ": num_samples * batch is too large");
  check_noise_range(op, m * out, in);
  if (m * out * in == 0) return at::empty(shape, opts);

  if (num_samples == 1 && is_plain_2d(dt, {loc_in, q_out_in, q_in_in}, variance_in, out, in)) {
    at::Tensor res = at::empty(shape, opts);
    at::Tensor z = res.view({out, in});
    Backend::noise(z, variance_in.contiguous(), BatchOffsets{}, out, in, seed_offset, 0.5);  // E * var^(1/2)
    at::Tensor buf = at::mm(q_out_in, z);
    at::mm_out(z, buf, q_in_in.mT());
    z.add_(loc_in);
    return res;
  }
  at::Tensor res = kron_eigen_noise_impl<Backend>(variance_in.to(dt), shape, seed_offset, 0.5);  // E * var^(1/2)
  at::Tensor res3 = res.view({m, out, in});
  at::Tensor buf = at::empty({m, out, in}, opts);
  const at::Tensor qo = q_out_in.to(dt), qi = q_in_in.to(dt);
  if (qo.dim() == 2) {
    left_mul(buf, qo.expand({m, out, out}), res3);
  } else {
    const at::Tensor qo3 = as_batched(qo, batch, n);
    for (int64_t k = 0; k < num_samples; ++k) {
      at::Tensor dst = buf.narrow(0, k * n, n);
      left_mul(dst, qo3, res3.narrow(0, k * n, n));
    }
  }
  if (qi.dim() == 2) {
    right_mul(res3, buf, qi.mT());
  } else {
    const at::Tensor qi3t = as_batched(qi, batch, n).mT();
    for (int64_t k = 0; k < num_samples; ++k) {
      at::Tensor dst = res3.narrow(0, k * n, n);
      right_mul(dst, buf.narrow(0, k * n, n), qi3t);
    }
  }
  res.add_(loc_in.to(dt));
  return res;
}

// The damped natural-gradient step of noisy K-FAC / EK-FAC for one layer:
// D = Q_out ((Q_out^T U Q_in) / (scale + damping)) Q_in^T and the inner product <D, U> (0-dim), with
// U = weight_decay * w + grad + grad_out^T grad_in: the loss gradient given as a matrix (grad), as the
// rows (grad_out (n, out), grad_in (n, in)) whose outer products sum to it, or both.  2-D operands of
// one floating dtype.
template <class Backend>
std::tuple<at::Tensor, at::Tensor> kron_eigen_ngd_impl(const at::Tensor& q_out, const at::Tensor& q_in,
                                                       const at::Tensor& scale, double damping, const at::Tensor& w,
                                                       double weight_decay, const std::optional<at::Tensor>& grad,
                                                       const std::optional<at::Tensor>& grad_out,
                                                       const std::optional<at::Tensor>& grad_in) {
  constexpr const char* op = "kron_eigen_ngd";
  TORCH_CHECK(w.dim() == 2, op, ": w must be an (out, in) matrix, got shape ", w.sizes());
  const int64_t out = w.size(0), in = w.size(1);
  TORCH_CHECK(q_out.dim() == 2 && q_out.size(0) == out && q_out.size(1) == out, op,
              ": q_out must be the (out, out) eigenbasis, out = w.size(0) = ", out, ", got shape ", q_out.sizes());
  TORCH_CHECK(q_in.dim() == 2 && q_in.size(0) == in && q_in.size(1) == in, op,
              ": q_in must be the (in, in) eigenbasis, in = w.size(1) = ", in, ", got shape ", q_in.sizes());
  TORCH_CHECK(scale.dim() == 2 && scale.size(0) == out && scale.size(1) == in, op,
              ": scale must have w's shape (", out, ", ", in, "), got shape ", scale.sizes());
  TORCH_CHECK(std::isfinite(damping), op, ": damping must be finite, got ", damping);
  TORCH_CHECK(std::isfinite(weight_decay), op, ": weight_decay must be finite, got ", weight_decay);
  TORCH_CHECK(grad_out.has_value() == grad_in.has_value(), op, ": grad_out and grad_in must be given together");
  common_float_dtype(op, {{"w", w}, {"q_out", q_out}, {"q_in", q_in}, {"scale", scale}});
  check_same_device(op, {{"w", w}, {"q_out", q_out}, {"q_in", q_in}, {"scale", scale}});
  check_same_dtype(op, "w", w, {{"q_out", q_out}, {"q_in", q_in}, {"scale", scale}});
  if (grad.has_value()) {
    TORCH_CHECK(grad->dim() == 2 && grad->size(0) == out && grad->size(1) == in, op, ": grad must have w's shape (",
                out, ", ", in, "), got shape ", grad->sizes());
    check_same_device(op, {{"w", w}, {"grad", *grad}});
    check_same_dtype(op, "w", w, {{"grad", *grad}});
  }
  if (grad_out.has_value()) {
    TORCH_CHECK(grad_out->dim() == 2 && grad_out->size(1) == out, op, ": grad_out must be an (n, out) matrix, out = ",
                out, ", got shape ", grad_out->sizes());
    TORCH_CHECK(grad_in->dim() == 2 && grad_in->size(1) == in && grad_in->size(0) == grad_out->size(0), op,
                ": grad_in must be an (n, in) matrix with grad_out's ", grad_out->size(0), " rows, in = ", in,
                ", got shape ", grad_in->sizes());
    check_same_device(op, {{"w", w}, {"grad_out", *grad_out}, {"grad_in", *grad_in}});
    check_same_dtype(op, "w", w, {{"grad_out", *grad_out}, {"grad_in", *grad_in}});
  }
  at::Tensor u;  // contiguous, not aliasing an input
  if (grad_out.has_value()) {
    u = at::addmm(w, grad_out->mT(), *grad_in, weight_decay, 1.0);
    if (grad.has_value()) u.add_(*grad);
  } else if (grad.has_value()) {
    u = at::add(*grad, w, weight_decay);
  } else {
    u = at::mul(w, weight_decay);
  }
  at::Tensor res = at::empty({out, in}, w.options());
  if (out * in == 0) return {res, at::zeros({}, w.options())};
  const at::Tensor s = damping == 0.0 ? scale.contiguous() : at::add(scale, damping);
  eigen_scale_2d<Backend>(res, q_out, q_in, s, u, -1.0);
  return {res, at::dot(res.view({-1}), u.view({-1}))};
}

// beta * moments + alpha * ((e Q_out)^2)^T (x Q_in)^2 (squares elementwise): the EK-FAC running
// second moments of the per-example gradients e_n x_n^T in the Kronecker eigenbasis, for
// examples with one location each; x (n, in), e (n, out), moments (out, in).
inline at::Tensor kron_eigen_moments_impl(const at::Tensor& q_out, const at::Tensor& q_in, const at::Tensor& x,
                                          const at::Tensor& e, const at::Tensor& moments, double beta, double alpha) {
  constexpr const char* op = "kron_eigen_moments";
  TORCH_CHECK(x.dim() == 2, op, ": x must be an (n, in) matrix (one row per example), got shape ", x.sizes());
  TORCH_CHECK(e.dim() == 2 && e.size(0) == x.size(0), op, ": e must be an (n, out) matrix with x's ", x.size(0),
              " rows, got shape ", e.sizes());
  const int64_t out = e.size(1), in = x.size(1);
  TORCH_CHECK(q_out.dim() == 2 && q_out.size(0) == out && q_out.size(1) == out, op,
              ": q_out must be the (out, out) eigenbasis, out = e.size(1) = ", out, ", got shape ", q_out.sizes());
  TORCH_CHECK(q_in.dim() == 2 && q_in.size(0) == in && q_in.size(1) == in, op,
              ": q_in must be the (in, in) eigenbasis, in = x.size(1) = ", in, ", got shape ", q_in.sizes());
  TORCH_CHECK(moments.dim() == 2 && moments.size(0) == out && moments.size(1) == in, op,
              ": moments must have shape (out, in) = (", out, ", ", in, "), got shape ", moments.sizes());
  TORCH_CHECK(std::isfinite(beta) && std::isfinite(alpha), op, ": beta and alpha must be finite, got ", beta, " and ",
              alpha);
  check_same_device(op, {{"x", x}, {"e", e}, {"q_out", q_out}, {"q_in", q_in}, {"moments", moments}});
  common_float_dtype(op, {{"x", x}, {"e", e}, {"q_out", q_out}, {"q_in", q_in}, {"moments", moments}});
  check_same_dtype(op, "x", x, {{"e", e}, {"q_out", q_out}, {"q_in", q_in}, {"moments", moments}});
  const at::Tensor xp = at::mm(x, q_in).square_();
  const at::Tensor ep = at::mm(e, q_out).square_();
  return at::addmm(moments, ep.mT(), xp, beta, alpha);
}

// The operators of one backend (its device guard, seed and passes, see the top).
template <class Backend>
struct Ops {
  static at::Tensor matvec(const at::Tensor& q_out, const at::Tensor& q_in, const at::Tensor& scale,
                           const at::Tensor& v, double power) {
    const typename Backend::Guard guard(v.device());
    return kron_eigen_matvec_impl<Backend>(q_out, q_in, scale, v, power);
  }

  static at::Tensor noise(const at::Tensor& variance, c10::SymIntArrayRef size, const at::Tensor& seed_offset,
                          double power) {
    const typename Backend::Guard guard(variance.device());
    const auto so = Backend::read("kron_eigen_noise", seed_offset, 1, variance.device());
    return kron_eigen_noise_impl<Backend>(variance, C10_AS_INTARRAYREF_SLOW(size), so, power);
  }

  static at::Tensor noise_keyed(const at::Tensor& variance, c10::SymIntArrayRef size, const at::Tensor& seed_offsets,
                                double power) {
    const typename Backend::Guard guard(variance.device());
    return kron_eigen_noise_keyed_impl<Backend>(variance, C10_AS_INTARRAYREF_SLOW(size), seed_offsets, power);
  }

  static std::tuple<at::Tensor, at::Tensor> sample(const at::Tensor& loc, const at::Tensor& q_out,
                                                   const at::Tensor& q_in, const at::Tensor& variance,
                                                   c10::SymInt num_samples, std::optional<at::Generator> generator,
                                                   std::optional<int64_t> seed, std::optional<int64_t> offset) {
    const int64_t n = num_samples.expect_int();
    TORCH_CHECK(n >= 0, "kron_eigen_sample: num_samples must be non-negative, got ", n);
    const typename Backend::Guard guard(loc.device());
    const auto drawn = Backend::draw("kron_eigen_sample", generator, seed, offset, 1, loc.device());
    return {kron_eigen_sample_impl<Backend>(loc, q_out, q_in, variance, n, drawn.seed), drawn.tensor()};
  }

  static std::tuple<at::Tensor, at::Tensor> ngd(const at::Tensor& q_out, const at::Tensor& q_in,
                                                const at::Tensor& scale, double damping, const at::Tensor& w,
                                                double weight_decay, const std::optional<at::Tensor>& grad,
                                                const std::optional<at::Tensor>& grad_out,
                                                const std::optional<at::Tensor>& grad_in) {
    const typename Backend::Guard guard(w.device());
    return kron_eigen_ngd_impl<Backend>(q_out, q_in, scale, damping, w, weight_decay, grad, grad_out, grad_in);
  }

  static at::Tensor moments(const at::Tensor& q_out, const at::Tensor& q_in, const at::Tensor& x,
                            const at::Tensor& e, const at::Tensor& moments, double beta, double alpha) {
    const typename Backend::Guard guard(x.device());
    return kron_eigen_moments_impl(q_out, q_in, x, e, moments, beta, alpha);
  }
};

}  // namespace kron
}  // namespace vmfdist
