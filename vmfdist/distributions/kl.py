r"""KL divergences that torch lacks, for the radius priors of the radial--directional layers.

Derived here from the densities (torch's parameterisations: ``Gamma(concentration,
rate)``, ``InverseGamma(concentration, rate)`` with density
:math:`\beta^\alpha x^{-\alpha-1}e^{-\beta/x}/\Gamma(\alpha)`, ``Weibull(scale, concentration)``,
``LogNormal(loc, scale)``) and checked against Monte Carlo in ``tests/test_radial.py``.
The radial--directional notes (002, §6.3--6.5) print three of them with errors: in eq. (50)
(Weibull) the Gamma-function argument must be :math:`k_p/k_q + 1`, not :math:`k_q/k_p + 1`,
and the term is :math:`(k_q - k_p)(\log\lambda_q - \gamma/k_q)`; eqs. (51)--(52) use a scale
parameter for the Gamma and drop the :math:`\log\pi` of the log-normal entropy.  torch's own
Gamma||Gamma agrees with eq. (49) (tested).

With :math:`q = \mathrm{LN}(\mu, \sigma^2)`: :math:`E\log x = \mu`,
:math:`E x^{\pm1} = e^{\pm\mu + \sigma^2/2}`, :math:`H[q] = \mu + \tfrac12\log(2\pi e\sigma^2)`.
"""
from __future__ import annotations

import math

import torch
from torch.distributions import Gamma, InverseGamma, LogNormal, Weibull
from torch.distributions.kl import register_kl

__all__ = []

_EULER_GAMMA = 0.57721566490153286060651209008240243


def _lognormal_entropy(q: LogNormal) -> torch.Tensor:
    mu, s = q.loc, q.scale
    return mu + 0.5 * torch.log(2 * math.pi * math.e * s * s)


@register_kl(LogNormal, Gamma)
def _kl_lognormal_gamma(q, p):
    r""":math:`-\alpha\log\beta + \log\Gamma(\alpha) - \alpha\mu + \beta e^{\mu+\sigma^2/2} - \tfrac12\log(2\pi e\sigma^2)`."""
    mu, s = q.loc, q.scale
    a, b = p.concentration, p.rate
    return (-a * torch.log(b) + torch.lgamma(a) - a * mu + b * torch.exp(mu + 0.5 * s * s)
            - 0.5 * torch.log(2 * math.pi * math.e * s * s))


@register_kl(LogNormal, InverseGamma)
def _kl_lognormal_inverse_gamma(q, p):
    r""":math:`-\alpha\log\beta + \log\Gamma(\alpha) + \alpha\mu + \beta e^{-\mu+\sigma^2/2} - \tfrac12\log(2\pi e\sigma^2)`."""
    mu, s = q.loc, q.scale
    a, b = p.concentration, p.rate
    return (-a * torch.log(b) + torch.lgamma(a) + a * mu + b * torch.exp(-mu + 0.5 * s * s)
            - 0.5 * torch.log(2 * math.pi * math.e * s * s))


@register_kl(Weibull, Weibull)
def _kl_weibull_weibull(q, p):
    r""":math:`\log\frac{k_q}{\lambda_q^{k_q}} - \log\frac{k_p}{\lambda_p^{k_p}}
    + (k_q - k_p)(\log\lambda_q - \gamma/k_q) + (\lambda_q/\lambda_p)^{k_p}\Gamma(1 + k_p/k_q) - 1`."""
    lq, kq = q.scale, q.concentration
    lp, kp = p.scale, p.concentration
    return (torch.log(kq) - kq * torch.log(lq) - torch.log(kp) + kp * torch.log(lp)
            + (kq - kp) * (torch.log(lq) - _EULER_GAMMA / kq)
            + torch.exp(kp * (torch.log(lq) - torch.log(lp)) + torch.lgamma(1 + kp / kq)) - 1)
