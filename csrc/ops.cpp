// The one place where every vmfdist operator schema is declared.
//
// Backends register kernels for these schemas in their own translation units:
//   csrc/cpu/*_cpu.cpp    TORCH_LIBRARY_IMPL(vmfdist, CPU, m)
//   csrc/cuda/*_cuda.cu   TORCH_LIBRARY_IMPL(vmfdist, CUDA, m)
// Fake (meta) kernels and autograd formulas are registered in Python
// (vmfdist/_ops/*.py), following pytorch/extension-cpp.
#include <Python.h>
#include <ATen/core/enum_tag.h>
#include <torch/library.h>

extern "C" {
// Importing vmfdist._C from Python runs the static registrations below.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(vmfdist, m) {
  // ---- Bessel special functions (elementwise, broadcasting; float32/float64) ----
  // R = I_nu(z) / I_{nu-1}(z), or 1 - R when complement is true.
  m.def("bessel_iv_ratio(Tensor nu, Tensor z, bool complement=False) -> Tensor");
  // dR/dz (the derivative of the ratio itself, whatever `complement` the caller used).
  m.def("bessel_iv_ratio_grad(Tensor nu, Tensor z) -> Tensor");
  // d^2R/dz^2 (second-order dual numbers through the same fraction).
  m.def("bessel_iv_ratio_grad2(Tensor nu, Tensor z) -> Tensor");
  // log I_nu(z), or log I_nu(z) - z when scaled is true.
  m.def("log_bessel_iv(Tensor nu, Tensor z, bool scaled=False) -> Tensor");
  // d/dz of log_bessel_iv (same `scaled` convention).
  m.def("log_bessel_iv_grad(Tensor nu, Tensor z, bool scaled=False) -> Tensor");
  // Ruiz-Antolin--Segura bounds on R (theorem 4 or 5) -> (lower, upper).
  m.def("bessel_iv_ratio_bounds(Tensor nu, Tensor z, int theorem=5) -> (Tensor, Tensor)");
  // The papers' approximation (B2 + B0) / 2 of R.
  m.def("bessel_iv_ratio_approx(Tensor nu, Tensor z) -> Tensor");
  // The papers' two-branch approximation of log I_nu(z) (eq. 44).
  m.def("log_bessel_iv_asymptotic(Tensor nu, Tensor z) -> Tensor");
  // The papers' log-ratio series (eq. 45).
  m.def("log_bessel_iv_series(Tensor nu, Tensor z) -> Tensor");

  // ---- von Mises-Fisher (csrc/include/vmfdist/vmf.h) ----
  // num_samples draws from vMF(loc[b], concentration[b]) for every batch row b:
  // returns x (num_samples, batch, d) and 1 - w = 1 - mu^T x (num_samples, batch).
  // Row r of (num_samples, batch) uses the Philox streams (seed, offset, r) and
  // (seed, offset + 1, r).  Randomness (every random op below): an explicit seed (and
  // offset), or else drawn inside the op from `generator` / the device's default
  // generator (csrc/host/random_state.h); tagged nondeterministic_seeded like torch's
  // own random ops, so compiled, traced and graph-captured code draws fresh values.
  m.def("vmf_sample(Tensor loc, Tensor concentration, SymInt num_samples, *, Generator? generator=None, "
        "int? seed=None, int? offset=None) -> (Tensor, Tensor)",
        {at::Tag::nondeterministic_seeded});
  // dw/dkappa of the vMF marginal on S^{dim-1} at w = 1 - one_minus_w (implicit
  // reparameterisation; elementwise, broadcasting).
  m.def("vmf_marginal_grad(Tensor one_minus_w, Tensor concentration, int dim) -> Tensor");
  // The backward of vmf_sample (implicit reparameterisation, vmf.h): from the gradients of
  // its outputs (grad_one_minus_w may be None) and the sample itself, returns (d/dloc (batch, d),
  // d/dconcentration (batch,)), summed over samples; an output not asked for (loc_grad,
  // concentration_grad false) is an empty (0,) tensor.  No derivative of its own.
  m.def("vmf_sample_backward(Tensor grad_x, Tensor? grad_one_minus_w, Tensor loc, Tensor concentration, "
        "Tensor x, Tensor one_minus_w, bool loc_grad=True, bool concentration_grad=True) -> (Tensor, Tensor)");

  // ---- Power spherical (csrc/include/vmfdist/power_spherical.h) ----
  // num_samples draws from PowerSpherical(loc[b], concentration[b]) (De Cao & Aziz 2020) for
  // every batch row b: returns x (num_samples, batch, d) and 1 - t = 1 - mu^T x
  // (num_samples, batch).  Row r uses the Philox streams (seed, offset, r) (the marginal,
  // t = 2B - 1 with B ~ Beta((d-1)/2 + kappa, (d-1)/2) from two Gamma variates) and
  // (seed, offset + 1, r) (the tangent normals, as vmf_sample); the reflection is
  // vmf_sample's, so its backward with respect to loc is vmf_sample_backward's.
  m.def("power_spherical_sample(Tensor loc, Tensor concentration, SymInt num_samples, *, Generator? generator=None, "
        "int? seed=None, int? offset=None) -> (Tensor, Tensor)",
        {at::Tag::nondeterministic_seeded});
  // dt/dkappa of the power spherical marginal on S^{dim-1} at t = 1 - one_minus_t (implicit
  // reparameterisation through the Beta CDF; elementwise, broadcasting).
  m.def("power_spherical_marginal_grad(Tensor one_minus_t, Tensor concentration, int dim) -> Tensor");
  // The backward of power_spherical_sample, as vmf_sample_backward with the power spherical
  // marginal's dt/dkappa (power_spherical_marginal_grad's, fused into the pass over sample rows) on
  // the CPU; on CUDA composed from those two ops (host/power_spherical_host.h).  No derivative of
  // its own.
  m.def("power_spherical_sample_backward(Tensor grad_x, Tensor? grad_one_minus_t, Tensor loc, "
        "Tensor concentration, Tensor x, Tensor one_minus_t, bool loc_grad=True, bool concentration_grad=True) -> "
        "(Tensor, Tensor)");

  // ---- Radial noise (csrc/include/vmfdist/radial.h) ----
  // out[s] = loc + scale * eps_s * r_s / |eps_s| (|.| over the event, or per row of the
  // last dimension when rowwise); returns (out (num_samples, *loc.shape), coef = r / |eps|
  // of shape (num_samples,) or (num_samples, rows), always float64, seed_offset, the
  // int64 (2,) tensor [seed, offset] it used, on loc's device, and noise: the eps, like out,
  // when save_noise, else empty).  Streams (seed, offset) and (seed, offset + 1).
  m.def("radial_noise(Tensor loc, Tensor scale, SymInt num_samples, bool rowwise=False, bool save_noise=False, *, "
        "Generator? generator=None, int? seed=None, int? offset=None) -> (Tensor, Tensor, Tensor, Tensor)",
        {at::Tag::nondeterministic_seeded});
  // sum_s grad[s] * eps_s * coef_s with eps read from noise (radial_noise's fourth output) when
  // given, else regenerated from the streams of seed_offset (its third): d/dscale of radial_noise.
  m.def("radial_noise_scale_grad(Tensor grad, Tensor coef, Tensor seed_offset, bool rowwise=False, "
        "Tensor? noise=None) -> Tensor");
  // The Radial layers' training draw: radial_noise over the whole tensor with scale = softplus(rho)
  // computed inside (the same eps and coef for the same seed and offset) and, when prior_loc and
  // prior_scale are given, the KL of Radial(loc, softplus(rho)) to N(prior_loc, prior_scale^2) in
  // the same pass, plus kl_offset (the caller's constant K(D) of radial.h: the KL is then one
  // autograd node; 0 without a prior): returns (out
  // (num_samples, *rho.shape), coef (num_samples,) float64, seed_offset, noise (the eps like out
  // when save_noise, else empty), kl (0-dim)).
  m.def("radial_sample(Tensor loc, Tensor rho, Tensor? prior_loc, Tensor? prior_scale, SymInt num_samples, "
        "bool save_noise=False, float kl_offset=0.0, *, Generator? generator=None, int? seed=None, "
        "int? offset=None) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        {at::Tag::nondeterministic_seeded});
  // The gradients of radial_sample: (grad_loc, grad_rho) with grad_rho = sigmoid(rho) sum_s grad[s]
  // eps_s coef_s and, when loc_grad, grad_loc = sum_s grad[s] (else an empty tensor), each plus
  // grad_kl times the KL's derivative when grad_kl is given; eps read from noise when given, else
  // regenerated from seed_offset's streams.  No derivative of its own.
  m.def("radial_sample_backward(Tensor grad, Tensor loc, Tensor rho, Tensor coef, Tensor seed_offset, "
        "Tensor? noise, Tensor? prior_loc, Tensor? prior_scale, Tensor? grad_kl, bool loc_grad=True) -> "
        "(Tensor, Tensor)");

  // ---- Radial--directional layers (csrc/include/vmfdist/rdp.h) ----
  // The KL of one grouping of an RDP layer and its gradient: G times KL(vMF(exp(log_kappa)) ||
  // vMF(prior_kappa)) with equal mean directions (|| uniform on S^{dim-1} when uniform) plus, for
  // the G local radius factors (local, rows m_a, m_b, rho_a, rho_b of shape (4, G)) and the global
  // one (glob, (4,)), KL(LogNormal(m_a, softplus(rho_a)) || Gamma(1/2, rate tau^-2)) +
  // KL(LogNormal(m_b, softplus(rho_b)) || InverseGamma(1/2, 1)), tau = tau_local or tau_global.
  // Returns (kl, d kl/d log_kappa, d kl/d local, d kl/d glob), computed in double.  No derivative
  // of its own (its gradient is among its outputs).
  m.def("rdp_kl(Tensor log_kappa, Tensor local, Tensor glob, Tensor prior_kappa, Tensor tau_local, "
        "Tensor tau_global, int dim, bool uniform) -> (Tensor, Tensor, Tensor, Tensor)");

  // ---- Mean-field Gaussian with softplus scale (csrc/include/vmfdist/meanfield.h) ----
  // out[s] = loc + softplus(rho) * eps_s (softplus(rho) * eps_s without loc) for num_samples
  // draws and, when prior_loc and prior_scale are given (with loc), the KL of meanfield_kl in
  // the same pass (else 0): returns (out (num_samples, *rho.shape), noise, kl, seed_offset
  // [seed, offset]); noise holds the eps (float32, or float64 for float64 rho) when
  // save_noise, else it is empty.  Element j of sample s is normal j of the Philox stream
  // (seed, offset, s).
  m.def("meanfield_sample(Tensor? loc, Tensor rho, Tensor? prior_loc, Tensor? prior_scale, SymInt num_samples, "
        "bool save_noise=False, *, Generator? generator=None, int? seed=None, int? offset=None) -> "
        "(Tensor, Tensor, Tensor, Tensor)",
        {at::Tag::nondeterministic_seeded});
  // The gradients of meanfield_sample: (grad_loc, grad_rho) with grad_rho = sigmoid(rho)
  // sum_s grad[s] eps_s and, when loc_grad, grad_loc = sum_s grad[s] (else an empty tensor),
  // each plus grad_kl times the KL's derivative when grad_kl is given; eps is read from noise
  // (the forward's kept normals) or, without it, regenerated from seed_offset.
  m.def("meanfield_sample_backward(Tensor grad, Tensor rho, Tensor seed_offset, Tensor? noise, Tensor? loc, "
        "Tensor? prior_loc, Tensor? prior_scale, Tensor? grad_kl, bool loc_grad) -> (Tensor, Tensor)");
  // sum_i KL(N(loc_i, softplus(rho_i)^2) || N(prior_loc_i, prior_scale_i^2)), a 0-dim tensor;
  // prior_loc and prior_scale each have one element or rho's shape.
  m.def("meanfield_kl(Tensor loc, Tensor rho, Tensor prior_loc, Tensor prior_scale) -> Tensor");
  // grad * (d/dloc, d/drho) of meanfield_kl; grad has one element.
  m.def("meanfield_kl_backward(Tensor grad, Tensor loc, Tensor rho, Tensor prior_loc, Tensor prior_scale) -> "
        "(Tensor, Tensor)");

  // ---- Kronecker-factored eigenbases (csrc/include/vmfdist/kron.h, kron_host.h) ----
  // Q_out ((Q_out^T V Q_in) * scale^power) Q_in^T for V (..., out, in), q_out (..., out, out),
  // q_in (..., in, in), scale (..., out, in); batch dimensions broadcast, dtypes promote.
  m.def("kron_eigen_matvec(Tensor q_out, Tensor q_in, Tensor scale, Tensor v, float power=1.0) -> Tensor");
  // E * variance^power with E standard normal of the given size (..., out, in), variance
  // broadcasting to it; row r (over all dimensions but the last) is the Philox stream
  // (seed, offset, r) of seed_offset = [seed, offset] (int64 (2,), variance's device).
  // Deterministic: it regenerates kron_eigen_sample's noise.
  m.def("kron_eigen_noise(Tensor variance, SymInt[] size, Tensor seed_offset, float power=0.5) -> Tensor");
  // The same with one stream per matrix: matrix k of the leading dimensions of size (..., out, in)
  // is kron_eigen_noise(variance[k], (out, in), seed_offsets[k]) -- row i of it the Philox stream
  // (seed_k, offset_k, i).  seed_offsets: int64 (prod(size[:-2]), 2), variance's device.  One call
  // draws the noise of many independent samplers (vmfdist.optim's batched optimizers).
  m.def("kron_eigen_noise_keyed(Tensor variance, SymInt[] size, Tensor seed_offsets, float power=0.5) -> Tensor");
  // loc + Q_out (E * variance^(1/2)) Q_in^T for num_samples draws: returns
  // ((num_samples, *batch, out, in), seed_offset); E is kron_eigen_noise(variance, that
  // size, seed_offset).
  m.def("kron_eigen_sample(Tensor loc, Tensor q_out, Tensor q_in, Tensor variance, SymInt num_samples, *, "
        "Generator? generator=None, int? seed=None, int? offset=None) -> (Tensor, Tensor)",
        {at::Tag::nondeterministic_seeded});
  // The damped natural-gradient step of noisy K-FAC / EK-FAC (vmfdist.optim) for one layer:
  // D = Q_out ((Q_out^T U Q_in) / (scale + damping)) Q_in^T with U = weight_decay * w + grad +
  // grad_out^T grad_in (the loss gradient as a matrix, as per-example rows, or both); returns
  // (D, <D, U> as a 0-dim tensor).  2-D operands of one dtype: w, grad, scale (out, in), q_out
  // (out, out), q_in (in, in), grad_out (n, out), grad_in (n, in).  No derivative (an optimizer update).
  m.def("kron_eigen_ngd(Tensor q_out, Tensor q_in, Tensor scale, float damping, Tensor w, float weight_decay, "
        "Tensor? grad=None, Tensor? grad_out=None, Tensor? grad_in=None) -> (Tensor, Tensor)");
  // beta * moments + alpha * ((e Q_out)^2)^T (x Q_in)^2, squares elementwise: EK-FAC's running
  // second moments of the per-example gradients e_n x_n^T in the Kronecker eigenbasis (examples
  // with one location each).  x (n, in), e (n, out), moments (out, in), one dtype.  No derivative.
  m.def("kron_eigen_moments(Tensor q_out, Tensor q_in, Tensor x, Tensor e, Tensor moments, float beta, "
        "float alpha) -> Tensor");

  // ---- Counter-based randomness (Philox4x32-10, csrc/include/vmfdist/philox.h) ----
  // Raw Philox4x32 blocks: counter (n, 4) and key (n, 2) hold uint32 values in int64.
  m.def("philox4x32(Tensor counter, Tensor key, int rounds=10) -> Tensor");
  // Uniform (0, 1) / standard normal variates, element i drawn from (seed, offset, i).
  m.def("philox_uniform(SymInt[] size, *, ScalarType dtype, Device device, Generator? generator=None, "
        "int? seed=None, int? offset=None) -> Tensor",
        {at::Tag::nondeterministic_seeded});
  m.def("philox_normal(SymInt[] size, *, ScalarType dtype, Device device, Generator? generator=None, "
        "int? seed=None, int? offset=None) -> Tensor",
        {at::Tag::nondeterministic_seeded});
}

// ---- Backend selection for the factory ops ----------------------------------
// philox_uniform and philox_normal have no tensor arguments, so the dispatcher
// has no backend to read off their inputs.  PyTorch's own factory functions
// (at::empty, at::rand, ...) solve this with a BackendSelect kernel that turns
// the (dtype, layout, device) arguments into a dispatch key and redispatches;
// we do the same.  Each backend then registers an ordinary kernel under its own
// key (CPU in csrc/cpu/random_cpu.cpp, CUDA in csrc/cuda/random_cuda.cu; Meta
// is the fake kernel of vmfdist/_ops/random.py), so there is no #ifdef here and an
// unsupported device gets the dispatcher's usual "no kernel for backend" error.
// Python modes (FakeTensorMode, torch.compile tracing) sit above BackendSelect
// and see the call first.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/Generator.h>
#include <c10/core/TensorOptions.h>

#include <optional>
#include <utility>

namespace {

using PhiloxFactoryFn = at::Tensor(c10::SymIntArrayRef, at::ScalarType, at::Device, std::optional<at::Generator>,
                                   std::optional<int64_t>, std::optional<int64_t>);

template <const char* kName>
at::Tensor philox_factory_backend_select(c10::SymIntArrayRef size, at::ScalarType dtype, at::Device device,
                                         std::optional<at::Generator> generator, std::optional<int64_t> seed,
                                         std::optional<int64_t> offset) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(kName, "").typed<PhiloxFactoryFn>();
  const c10::DispatchKeySet ks(c10::computeDispatchKey(dtype, at::kStrided, device));
  return op.redispatch(ks, size, dtype, device, std::move(generator), seed, offset);
}

constexpr char kPhiloxUniform[] = "vmfdist::philox_uniform";
constexpr char kPhiloxNormal[] = "vmfdist::philox_normal";

}  // namespace

TORCH_LIBRARY_IMPL(vmfdist, BackendSelect, m) {
  m.impl("philox_uniform", &philox_factory_backend_select<kPhiloxUniform>);
  m.impl("philox_normal", &philox_factory_backend_select<kPhiloxNormal>);
}
