r"""Shared machinery of the Bayesian layers: the mode switch, priors stored as buffers,
and the linear / convolution kernels that evaluate several weight samples at once.

Several weight samples in one call ("folded" evaluation): when a layer's
``_num_samples`` is ``S > 1`` its input holds ``S`` stacked copies of a batch along
dimension 0 (shape ``(S * B, ...)``, sample-major).  The layer draws ``S`` weight tensors
in one call of its sampler and applies sample ``s`` to rows ``s*B .. (s+1)*B - 1`` with one
batched matrix product (``torch.baddbmm``) or one grouped convolution (the ``S`` samples
become ``S * groups`` convolution groups).  Layers that are not Bayesian (activations,
pooling, ``Flatten``, ...) see an ordinary batch of ``S * B`` rows, so any
``nn.Sequential``-style model is evaluated for all samples in one pass.

Several weight samples on one shared input (:meth:`BayesianModule._forward_shared`, used by
:func:`~vmfdist.nn.predict` for the first Bayesian layer of a model, whose input is the same
for every sample): the input ``(B, ...)`` is not repeated; the ``S`` weight samples are applied
by one matrix product against the stacked weights ``(S * out, in)`` (one convolution with
``S * out`` output channels), in passes bounded by memory (:func:`_pass_sizes`), and the result
is returned sample-major, ``(S * B, ...)``; linear layers with an exact per-example draw
(mean-field, Radial: ``_per_example_draws``) use it instead for a batch of vectors when it costs
less (:func:`_local_is_cheaper`).
"""
from __future__ import annotations

import math
from numbers import Number
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Distribution, Independent, Normal

from ..distributions import Radial, kl_radial_radial
from ..distributions.kl import kl_diag_normal, kl_radial_normal

__all__ = ["BayesianModule", "MODES"]

#: The modes of a Bayesian layer: draw weights, use the posterior mean, use the posterior mode.
MODES = ("sample", "mean", "mode")


def _check_mode(mode: str, name: str = "mode") -> str:
    if mode not in MODES:
        raise ValueError(f"{name} must be one of {MODES}, got {mode!r}")
    return mode


#: dtypes whose KL is computed in float32
LOW_PRECISION = (torch.float16, torch.bfloat16)


def full_precision(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t`` in float32 when it is float16 / bfloat16 (differentiably), else ``t`` itself."""
    return t.float() if t is not None and t.dtype in LOW_PRECISION else t


class _Prior(nn.Module):
    r"""A prior over one parameter tensor, stored so that ``state_dict`` restores it.

    Accepts a float ``s`` (meaning :math:`\mathcal N(0, s^2)` per element), any
    ``torch.distributions.Distribution`` whose parameters are tensors (its class is kept,
    its parameters become persistent buffers named ``param_<name>``; an ``Independent``
    wrapper is unwrapped and remembered), or an ``nn.Module`` whose ``forward()`` returns a
    distribution (a learned or hierarchical prior; its own state is saved with it).

    :meth:`distribution` returns the prior over a tensor of a given shape: an elementwise
    prior is broadcast to the shape and made ``Independent`` over all its dimensions; a
    prior whose ``batch_shape + event_shape`` already equals the shape (e.g. a
    :class:`~vmfdist.distributions.radial.Radial` over the whole tensor) is used as it is.
    """

    def __init__(self, prior, name: str = "prior", device=None, dtype=None):
        super().__init__()
        self._init(prior, name)
        if device is not None or dtype is not None:  # the layer's device= (meta included) and dtype=
            self.to(device=device, dtype=dtype)

    def _init(self, prior, name: str) -> None:
        if prior is None:
            prior = 1.0
        self._module = None
        self._name = name
        if isinstance(prior, bool) or (isinstance(prior, Number) and not isinstance(prior, (int, float))):
            raise TypeError(f"{name} must be a positive float, a torch.distributions.Distribution or an nn.Module, "
                            f"got {prior!r}")
        if isinstance(prior, (int, float)):
            if not prior > 0 or prior != prior or prior == float("inf"):
                raise ValueError(f"{name}: a float prior is the standard deviation of N(0, s^2) and must be positive "
                                 f"and finite, got {prior}")
            prior = Normal(torch.tensor(0.0), torch.tensor(float(prior)))
        if isinstance(prior, nn.Module):
            self._module = prior
            return
        if not isinstance(prior, Distribution):
            raise TypeError(f"{name} must be a positive float, a torch.distributions.Distribution or an nn.Module, "
                            f"got {type(prior).__name__}")
        self._ndims = 0
        base = prior
        if isinstance(prior, Independent):
            self._ndims = prior.reinterpreted_batch_ndims
            base = prior.base_dist
        self._cls = type(base)
        self._names = []
        for key in base.arg_constraints:
            if key in base.__dict__ and isinstance(base.__dict__[key], torch.Tensor):
                self.register_buffer("param_" + key, base.__dict__[key].detach().clone())
                self._names.append(key)
        if not self._names:
            raise ValueError(f"{name}: cannot store a {self._cls.__name__} prior (no tensor parameters found)")
        # rebuild once now so that an unusable prior fails at construction, not in the first step
        self._build()

    def _build(self) -> Distribution:
        params = {k: getattr(self, "param_" + k) for k in self._names}
        return self._cls(**params, validate_args=False)

    def distribution(self, shape: torch.Size) -> Distribution:
        shape = torch.Size(shape)
        if self._module is not None:
            d = self._module()
        else:
            d = self._build()
            if self._ndims:
                d = Independent(d, self._ndims)
        full = d.batch_shape + d.event_shape
        if full == shape and (isinstance(d, Radial) or len(d.event_shape) == len(shape)):
            return d
        if len(d.event_shape) == 0:
            try:
                d = d.expand(shape)
            except (RuntimeError, ValueError) as e:
                raise ValueError(f"{self._name}: a prior of batch shape {tuple(d.batch_shape)} does not broadcast to "
                                 f"the parameter shape {tuple(shape)}: {e}") from None
            return Independent(d, len(shape)) if len(shape) else d
        if full == shape:
            base = d.base_dist if isinstance(d, Independent) else d
            return Independent(base, len(shape) - len(base.event_shape)) if len(shape) > len(base.event_shape) else d
        raise ValueError(f"{self._name}: prior with batch shape {tuple(d.batch_shape)} and event shape "
                         f"{tuple(d.event_shape)} does not fit a parameter of shape {tuple(shape)}")

    def extra_repr(self) -> str:
        if self._module is not None:
            return "module"
        return f"{self._cls.__name__}({', '.join(self._names)})"


def _kl_gaussian_prior_fast(q: Distribution, prior: _Prior, shape) -> Optional[torch.Tensor]:
    r"""The closed forms of :mod:`vmfdist.distributions.kl` for an elementwise Gaussian prior
    :math:`\mathcal N(m, s^2)` whose parameters broadcast to ``shape``, from the prior's buffers
    (never materialised at full size): ``Independent(Normal(mu, sigma))`` through
    :func:`~vmfdist.distributions.kl.kl_diag_normal`, ``Radial(mu, sigma)`` through
    :func:`~vmfdist.distributions.kl.kl_radial_normal`.  Returns None when the prior is of
    another kind."""
    params = _gaussian_prior_params(prior, shape)
    if params is None:
        return None
    if isinstance(q, Independent) and isinstance(q.base_dist, Normal) and q.base_dist.loc.shape == torch.Size(shape):
        return kl_diag_normal(q.base_dist.loc, q.base_dist.scale, *params)
    if isinstance(q, Radial) and q.loc.shape == torch.Size(shape):
        return kl_radial_normal(q, *params)
    return None


def _gaussian_prior_params(prior: _Prior, shape):
    """(m, s) of an elementwise N(m, s^2) prior whose parameters broadcast to ``shape``; else None."""
    if prior._module is not None or prior._cls is not Normal or prior._ndims:
        return None
    m, s = prior.param_loc, prior.param_scale
    try:
        full = torch.broadcast_shapes(m.shape, s.shape, torch.Size(shape))
    except RuntimeError:
        return None
    return (m, s) if full == torch.Size(shape) else None


def kl_normal_to_prior(mu: torch.Tensor, sig: torch.Tensor, prior: _Prior, mc_samples: int = 16) -> torch.Tensor:
    r"""KL(prod_i N(mu_i, sig_i^2) || prior) summed to a scalar, from the tensors (no distribution
    objects for the elementwise Gaussian prior: :func:`~vmfdist.distributions.kl.kl_diag_normal`);
    other priors through :func:`kl_to_prior`."""
    params = _gaussian_prior_params(prior, mu.shape)
    if params is None:
        return kl_to_prior(Independent(Normal(mu, sig, validate_args=False), mu.dim(), validate_args=False), prior,
                           mu.shape, mc_samples)
    return kl_diag_normal(mu, sig, *params)


def kl_to_prior(q: Distribution, prior: _Prior, shape, mc_samples: int) -> torch.Tensor:
    """KL(q || prior) summed to a scalar: closed form where registered; for a Radial prior
    (no closed form) the unbiased Monte Carlo estimate with ``mc_samples`` samples."""
    fast = _kl_gaussian_prior_fast(q, prior, shape)
    if fast is not None:
        return fast
    p = prior.distribution(shape)
    if isinstance(p, Radial) and isinstance(q, Radial):
        return kl_radial_radial(q, p, mc_samples)
    try:
        return torch.distributions.kl_divergence(q, p).sum()
    except NotImplementedError as e:
        raise NotImplementedError(f"{prior._name}: no KL divergence is registered from the posterior "
                                  f"{type(q).__name__} to the prior {type(p).__name__} ({e}); register one with "
                                  "torch.distributions.kl.register_kl or choose another prior") from None


class BayesianModule(nn.Module):
    """Base class of the Bayesian layers.

    Every layer has a mode (``"sample"``: draw new weights on every forward, the default;
    ``"mean"`` / ``"mode"``: use the posterior mean / mode), :meth:`kl_divergence` (a
    scalar: the sum over all its weights) and ``weight_posterior()`` /
    ``bias_posterior()`` (distribution objects).
    """

    def __init__(self):
        super().__init__()
        self._mode = "sample"
        self._num_samples = 1

    # ---- mode ------------------------------------------------------------------
    @property
    def mode(self) -> str:
        return self._mode

    def set_mode(self, mode: str) -> "BayesianModule":
        """Set ``"sample"``, ``"mean"`` or ``"mode"``; returns the layer."""
        self._mode = _check_mode(mode)
        return self

    # ---- to be supplied by the layers -----------------------------------------
    def kl_divergence(self) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def weight_posterior(self) -> Distribution:  # pragma: no cover - abstract
        raise NotImplementedError

    def bias_posterior(self) -> Optional[Distribution]:  # pragma: no cover - abstract
        raise NotImplementedError

    def point_weights(self, use: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:  # pragma: no cover
        """``(weight, bias)`` of the posterior mean (``use="mean"``) or mode (``"mode"``)."""
        raise NotImplementedError

    def sample_weights(self, num_samples: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:  # pragma: no cover
        """``num_samples`` weight and bias samples stacked on a leading dimension (reparameterised)."""
        raise NotImplementedError

    # ---- evaluation ------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The layer applied to ``x`` with sampled weights (mode ``"sample"``) or the posterior
        mean / mode."""
        if self._mode != "sample":
            w, b = self.point_weights(self._mode)
            return self._apply_weights(x, w, b)
        return self._forward_sample(x, self._num_samples)

    def _forward_sample(self, x: torch.Tensor, num_samples: int) -> torch.Tensor:
        w, b = self.sample_weights(num_samples)
        return self._apply_samples(x, w, b, num_samples)

    def _apply_samples(self, x, w, b, num_samples: int) -> torch.Tensor:
        """The ``num_samples`` stacked weights ``w`` (and biases ``b`` or None) applied to the
        folded input ``x``: one sample as a plain layer call, several as one batched product."""
        if num_samples == 1:  # a view (w[0] would copy its gradient into a zero tensor of w's size)
            return self._apply_weights(x, w.view(w.shape[1:]), None if b is None else b.view(b.shape[1:]))
        return self._apply_folded(x, w, b, num_samples)

    #: Linear layers whose outputs for one example can be drawn exactly without weight samples
    #: (:meth:`_sample_per_example`) set this to the random draws that costs per sample and
    #: example beyond one normal per output, counted in normals; None: no such draw.
    _per_example_draws: Optional[int] = None

    def _sample_per_example(self, x: torch.Tensor, num_samples: int) -> torch.Tensor:  # pragma: no cover
        """``num_samples`` draws of the outputs for a batch of vectors ``x`` ``(B, in)``, each example
        from its exact distribution, independently per sample and example, as ``(num_samples * B,
        out)``, sample-major (for the layers that set :attr:`_per_example_draws`)."""
        raise NotImplementedError

    def _forward_shared(self, x: torch.Tensor, num_samples: int, samples_per_pass: Optional[int] = None) -> torch.Tensor:
        """``num_samples`` independent evaluations of the layer on the same input ``x`` (a batch
        of ``B``), returned sample-major as ``(num_samples * B, ...)``: what the folded evaluation
        gives for ``x`` repeated ``num_samples`` times, without repeating it.  A layer with a
        per-example draw uses it for a batch of vectors when :func:`_local_is_cheaper`; otherwise
        the weight samples are drawn and applied in passes of at most ``samples_per_pass``
        (default: :func:`_pass_sizes`).  Every example's outputs have the same distribution
        either way; only the dependence between examples through a shared weight sample is dropped
        by the per-example draw, which no per-example quantity sees."""
        if self._mode != "sample":
            y = self.forward(x)
            return y.unsqueeze(0).expand((num_samples,) + tuple(y.shape)).reshape((-1,) + tuple(y.shape[1:]))
        if (self._per_example_draws is not None and x.dim() == 2
                and _local_is_cheaper(x.shape[0], self.in_features, self.out_features, num_samples,
                                      per_example=self._per_example_draws)):
            return self._sample_per_example(x, num_samples)
        outs = []
        for c in _pass_sizes(num_samples, self._sample_bytes(), x.device, samples_per_pass):
            w, b = self.sample_weights(c)
            outs.append(self._apply_shared(x, w, b, c))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _sample_bytes(self) -> int:
        """Bytes of one weight sample (what a pass of ``S`` samples stacks ``S`` times)."""
        p = next(self.parameters(), None)
        return self._weight_numel() * (p.element_size() if p is not None else 4)

    @staticmethod
    def _split(x: torch.Tensor, num_samples: int) -> int:
        if x.shape[0] % num_samples:
            raise ValueError(f"input: the batch dimension ({x.shape[0]}) must hold num_samples={num_samples} stacked "
                             "copies of the batch")
        return x.shape[0] // num_samples


def _local_is_cheaper(batch, n_in, n_out, num_samples, normal_cost=16, per_example=0):
    """Whether a per-example draw (two products with the input, a normal per output, and
    ``per_example`` normals' worth of other draws per sample and example) costs less than the
    stacked weights (one product with ``S`` times the outputs, a normal per weight), counting a
    normal as ``normal_cost`` multiply-adds."""
    local = 2 * batch * n_in * n_out + normal_cost * num_samples * batch * (n_out + per_example)
    stacked = num_samples * batch * n_in * n_out + normal_cost * num_samples * n_in * n_out
    return local < stacked


#: On the CPU, :func:`~vmfdist.nn.predict` draws and applies the weight samples of a layer in
#: passes whose stacked samples stay within this many bytes (16 MiB): a 32-sample stack of a
#: 784 x 400 float32 weight (40 MB) is a fresh allocation that glibc serves with ``mmap`` on every
#: call, whose first-touch page faults cost about as much as drawing the numbers, and which leaves
#: the caches before it is read; passes of about 14 MB come back from the heap.  On other devices
#: all samples go in one pass.
CPU_PASS_BYTES = 16 * 2 ** 20


def _pass_sizes(num_samples: int, bytes_per_sample: int, device: torch.device,
                samples_per_pass: Optional[int] = None) -> list:
    """How many samples each pass evaluates: at most ``samples_per_pass`` (if given), else all at
    once unless on the CPU the stack would exceed :data:`CPU_PASS_BYTES`; passes as even as possible."""
    if samples_per_pass is None:
        if device.type != "cpu" or bytes_per_sample * num_samples <= CPU_PASS_BYTES:
            return [num_samples]
        samples_per_pass = max(1, CPU_PASS_BYTES // bytes_per_sample)
    k = -(-num_samples // samples_per_pass)
    q, r = divmod(num_samples, k)
    return [q + 1] * r + [q] * (k - r)


class _LinearOps:
    """``F.linear`` on one weight, ``baddbmm`` on a stack of weights."""

    def _weight_numel(self) -> int:
        return self.in_features * self.out_features

    def _check_input(self, x):
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input: expected last dimension in_features={self.in_features}, got shape "
                             f"{tuple(x.shape)}")

    def _apply_weights(self, x, w, b):
        self._check_input(x)
        return F.linear(x, w, b)

    def _apply_folded(self, x, w, b, s):
        self._check_input(x)
        if x.dim() < 2:
            raise ValueError("input: folded evaluation of several samples needs a batch dimension")
        bsz = BayesianModule._split(x, s)
        rest = x.shape[1:-1]
        xs = x.reshape(s, -1, self.in_features)
        if b is None:
            out = torch.bmm(xs, w.transpose(1, 2))
        else:
            out = torch.baddbmm(b.unsqueeze(1), xs, w.transpose(1, 2))
        return out.reshape((s * bsz,) + tuple(rest) + (self.out_features,))

    def _apply_shared(self, x, w, b, s):
        self._check_input(x)
        if x.dim() < 2:
            raise ValueError("input: evaluation of several samples needs a batch dimension")
        # one product against the stacked weights: (B, ..., in) x (in, S * out)
        y = F.linear(x, w.reshape(s * self.out_features, self.in_features), None if b is None else b.reshape(-1))
        y = y.reshape(tuple(x.shape[:-1]) + (s, self.out_features)).movedim(-2, 0)
        return y.reshape((s * x.shape[0],) + tuple(x.shape[1:-1]) + (self.out_features,))


class _ConvOps:
    """``F.conv2d`` on one weight; a stack of ``S`` weights as one convolution with
    ``S * groups`` groups."""

    def _weight_numel(self) -> int:
        return self.out_channels * (self.in_channels // self.groups) * math.prod(self.kernel_size)

    def _conv(self, x, w, b, groups):
        return F.conv2d(x, w, b, self.stride, self.padding, self.dilation, groups)

    def _check_input(self, x):
        if x.dim() not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ValueError(f"input: expected (N, {self.in_channels}, H, W) or ({self.in_channels}, H, W), got shape "
                             f"{tuple(x.shape)}")

    def _apply_weights(self, x, w, b):
        self._check_input(x)
        return self._conv(x, w, b, self.groups)

    def _apply_folded(self, x, w, b, s):
        self._check_input(x)
        if x.dim() != 4:
            raise ValueError("input: folded evaluation of several samples needs a batch dimension (N, C, H, W)")
        bsz = BayesianModule._split(x, s)
        c, h, wd = x.shape[1:]
        # (S*B, C, H, W) -> (B, S*C, H, W), in channels-last memory (B, H, W, S, C)
        xs = x.permute(0, 2, 3, 1).reshape(s, bsz, h, wd, c).permute(1, 2, 3, 0, 4).contiguous()
        xs = xs.view(bsz, h, wd, s * c).permute(0, 3, 1, 2)
        ws = w.reshape((s * self.out_channels,) + tuple(w.shape[2:]))
        bs = None if b is None else b.reshape(s * self.out_channels)
        return _sample_major(self._conv(xs, ws, bs, s * self.groups), s, 1, self.out_channels)

    def _apply_shared(self, x, w, b, s):
        """All ``S`` kernels on one input as one matrix product of the unfolded input (im2col)
        with the stacked kernels, per group: ``(B*L, C/g*kh*kw) x (C/g*kh*kw, S*out/g)``.  (One
        convolution with ``S * out`` output channels gives the same numbers, but oneDNN runs it
        several times slower than ``S`` separate convolutions for inputs with few channels, e.g.
        ten times for 1 -> 16 channels on 8x8 images and ``S = 32``.)"""
        self._check_input(x)
        if x.dim() != 4:
            raise ValueError("input: evaluation of several samples needs a batch dimension (N, C, H, W)")
        if isinstance(self.padding, str):  # "same" / "valid": let the convolution work out the padding
            g, o = self.groups, self.out_channels
            ws = w.reshape((s, g, o // g) + tuple(w.shape[2:])).transpose(0, 1).reshape((s * o,) + tuple(w.shape[2:]))
            bs = None if b is None else b.reshape(s, g, o // g).transpose(0, 1).reshape(-1)
            return _sample_major(self._conv(x, ws, bs, g), s, g, o)
        g, o = self.groups, self.out_channels
        bsz, c, h, wd = x.shape
        kh, kw = self.kernel_size
        (ph, pw), (sh, sw), (dh, dw) = self.padding, self.stride, self.dilation
        oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        k, og, rows = (c // g) * kh * kw, o // g, bsz * oh * ow
        cols = F.unfold(x, (kh, kw), dilation=(dh, dw), padding=(ph, pw), stride=(sh, sw))  # (B, C*kh*kw, L)
        cols = cols.view(bsz, g, k, oh * ow).permute(1, 0, 3, 2).reshape(1, g, rows, k)
        wt = w.reshape(s, g, og, k).transpose(2, 3)  # (S, g, k, o/g)
        cols = cols.expand(s, g, rows, k).reshape(s * g, rows, k)  # (a view for g = 1)
        if b is None:
            y = torch.bmm(cols, wt.reshape(s * g, k, og))
        else:
            y = torch.baddbmm(b.reshape(s * g, 1, og), cols, wt.reshape(s * g, k, og))
        # (S, g, B*L, o/g) -> (S*B, o, oh, ow), sample-major, channels-last memory (see _sample_major)
        y = y.view(s, g, bsz, oh, ow, og)
        y = y.view(s * bsz, oh, ow, o) if g == 1 else y.permute(0, 2, 3, 4, 1, 5).reshape(s * bsz, oh, ow, o)
        return y.permute(0, 3, 1, 2)


def _sample_major(y, s, g, o):
    """The output ``(B, g * S * o/g, H, W)`` of a convolution over stacked samples (channels
    ordered group, sample, channel in group) as ``(S * B, o, H, W)``, sample-major, in
    channels-last memory: torch's pooling and activation kernels are many times faster on
    channels-last tensors of many small images (max-pooling 2048 maps of 16 x 8 x 8: ~18x)."""
    bsz, _, oh, ow = y.shape
    y = y.permute(0, 2, 3, 1).reshape(bsz, oh, ow, g, s, o // g)
    y = y.permute(4, 0, 1, 2, 3, 5).contiguous()  # (S, B, H, W, g, o/g)
    return y.view(s * bsz, oh, ow, o).permute(0, 3, 1, 2)


def _pair(v, name):
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, str):
        return v
    v = tuple(v)
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise ValueError(f"{name} must be an int or a pair of ints, got {v!r}")
    return v


def _conv_setup(layer, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, padding_mode):
    for name, val in (("in_channels", in_channels), ("out_channels", out_channels), ("groups", groups)):
        if not isinstance(val, int) or val <= 0:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}")
    if padding_mode != "zeros":
        raise ValueError(f"padding_mode: only 'zeros' is supported by the Bayesian convolutions, got {padding_mode!r}")
    layer.in_channels, layer.out_channels = in_channels, out_channels
    layer.kernel_size = _pair(kernel_size, "kernel_size")
    layer.stride = _pair(stride, "stride")
    layer.padding = _pair(padding, "padding")
    layer.dilation = _pair(dilation, "dilation")
    layer.groups = groups
    layer.padding_mode = padding_mode
    return (out_channels, in_channels // groups) + tuple(layer.kernel_size)


def _linear_setup(layer, in_features, out_features):
    for name, val in (("in_features", in_features), ("out_features", out_features)):
        if not isinstance(val, int) or val <= 0:
            raise ValueError(f"{name} must be a positive int, got {val!r}")
    layer.in_features, layer.out_features = in_features, out_features
    return (out_features, in_features)


def _conv_repr(layer):
    s = (f"{layer.in_channels}, {layer.out_channels}, kernel_size={layer.kernel_size}, stride={layer.stride}")
    if layer.padding not in ((0, 0), 0):
        s += f", padding={layer.padding}"
    if layer.dilation != (1, 1):
        s += f", dilation={layer.dilation}"
    if layer.groups != 1:
        s += f", groups={layer.groups}"
    return s


def _softplus_inv(x: float) -> float:
    return x + math.log(-math.expm1(-x))


class _ScaledGaussianLayer(BayesianModule):
    """Shared by the mean-field and Radial layers: weight and bias each have a mean and a scale
    sigma = softplus(rho); the subclass supplies the posterior family (``weight_posterior``,
    ``bias_posterior``) and the sampler."""

    def _init_scale_parameters(self, wshape, bias: bool, sigma_init: float, prior, bias_prior,
                               prior_kl_samples: int, device, dtype) -> None:
        """weight_mu (He-initialised), weight_rho = softplus^-1(sigma_init), the bias pair (or
        None), and the priors as modules (``bias_prior`` defaults to ``prior``)."""
        fk = {"device": device, "dtype": dtype}
        self.weight_mu = nn.Parameter(torch.empty(wshape, **fk))
        self.weight_rho = nn.Parameter(torch.full(wshape, _softplus_inv(sigma_init), **fk))
        if bias:
            self.bias_mu = nn.Parameter(torch.zeros(wshape[0], **fk))
            self.bias_rho = nn.Parameter(torch.full((wshape[0],), _softplus_inv(sigma_init), **fk))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_rho", None)
        self.prior = _Prior(prior, "prior", device=device, dtype=dtype)
        self.bias_prior = _Prior(prior if bias_prior is None else bias_prior, "bias_prior", device=device, dtype=dtype)
        self.prior_kl_samples = prior_kl_samples
        nn.init.kaiming_normal_(self.weight_mu, nonlinearity="relu")

    @property
    def weight_sigma(self) -> torch.Tensor:
        return F.softplus(self.weight_rho)

    @property
    def bias_sigma(self) -> Optional[torch.Tensor]:
        return None if self.bias_rho is None else F.softplus(self.bias_rho)

    def kl_divergence(self) -> torch.Tensor:
        """KL(q || prior) summed over weights and bias: closed form for a Gaussian prior, the
        unbiased Monte Carlo estimate (``prior_kl_samples`` samples) otherwise.  A float16 /
        bfloat16 layer's KL is computed and returned in float32 (a sum over many weights
        overflows half precision)."""
        kl = kl_to_prior(self._kl_posterior(self.weight_mu, self.weight_rho), self.prior, self.weight_mu.shape,
                         self.prior_kl_samples)
        if self.bias_mu is not None:
            kl = kl + kl_to_prior(self._kl_posterior(self.bias_mu, self.bias_rho), self.bias_prior,
                                  self.bias_mu.shape, self.prior_kl_samples)
        return kl

    def _kl_posterior(self, mu: torch.Tensor, rho: torch.Tensor) -> Distribution:
        """The posterior at ``(mu, softplus(rho))`` for the KL: the parameters themselves, or their
        float32 copies for a float16 / bfloat16 layer."""
        return self._posterior_from(full_precision(mu), F.softplus(full_precision(rho)))

    def _posterior_from(self, loc: torch.Tensor, scale: torch.Tensor) -> Distribution:
        """The posterior family at ``(loc, scale)`` (the subclass's; ``weight_posterior`` and the KL use it)."""
        raise NotImplementedError

    def point_weights(self, use):
        return self.weight_mu, self.bias_mu
