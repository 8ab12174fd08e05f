"""Tests of vmfdist.nn: layer KLs against Monte Carlo, the ELBO scaling, state_dict round trips,
conversion, batched evaluation, predictive and metrics against peers, bad input."""
import math

import numpy as np
import pytest
import scipy.special
import scipy.stats
import torch
from torch import nn
from torch.distributions import Laplace, Normal

import vmfdist.nn as vnn
from vmfdist.distributions import Radial

DT = torch.float64


def _mc_check(samples, exact, z=5.0):
    """|mean - exact| within z standard errors (the per-draw values are i.i.d.)."""
    samples = torch.as_tensor(samples, dtype=DT)
    mean = float(samples.mean())
    se = float(samples.std()) / math.sqrt(samples.numel())
    assert abs(mean - float(exact)) <= z * se + 1e-12 * abs(float(exact)), (mean, float(exact), se)


# ---------------------------------------------------------------------------------------------
# KL divergences against Monte Carlo


def _perturb(layer, scale=0.3):
    with torch.no_grad():
        for n, p in layer.named_parameters():
            p.add_(scale * torch.randn_like(p))


@pytest.mark.parametrize("cls,prior", [(vnn.MeanFieldLinear, 0.7), (vnn.MeanFieldLinear, "laplace"),
                                       (vnn.RadialLinear, 0.7)])
def test_kl_gaussian_family_vs_monte_carlo(cls, prior):
    torch.manual_seed(0)
    if prior == "laplace":
        prior = Laplace(torch.tensor(0.1, dtype=DT), torch.tensor(0.5, dtype=DT))
    layer = cls(5, 3, dtype=DT, prior=prior, sigma_init=0.4)
    _perturb(layer, 0.2)
    layer.requires_grad_(False)
    kl = float(layer.kl_divergence())
    qw, qb = layer.weight_posterior(), layer.bias_posterior()
    pw = layer.prior.distribution(layer.weight_mu.shape)
    pb = layer.bias_prior.distribution(layer.bias_mu.shape)
    n = 20000
    w, b = qw.sample((n,)), qb.sample((n,))
    # independent log densities: scipy for the Gaussian / Laplace terms, the Radial density's own formula
    if cls is vnn.MeanFieldLinear:
        lq = (scipy.stats.norm.logpdf(w.numpy(), layer.weight_mu.detach().numpy(),
                                      layer.weight_sigma.detach().numpy()).sum((1, 2))
              + scipy.stats.norm.logpdf(b.numpy(), layer.bias_mu.detach().numpy(),
                                        layer.bias_sigma.detach().numpy()).sum(1))
    else:  # Radial: |v| half-normal, v/|v| uniform on the sphere (scipy's halfnorm and gammaln)
        lq = 0.0
        for val, loc, sig in ((w, layer.weight_mu, layer.weight_sigma), (b, layer.bias_mu, layer.bias_sigma)):
            v = ((val - loc) / sig).reshape(n, -1).numpy()
            dim = v.shape[1]
            r = np.linalg.norm(v, axis=1)
            log_area = math.log(2) + 0.5 * dim * math.log(math.pi) - scipy.special.gammaln(0.5 * dim)
            lq = lq + (scipy.stats.halfnorm.logpdf(r) - log_area - (dim - 1) * np.log(r)
                       - np.log(sig.numpy()).sum())
    base = pw.base_dist
    if isinstance(base, Normal):
        lp = (scipy.stats.norm.logpdf(w.numpy(), 0.0, 0.7).sum((1, 2)) + scipy.stats.norm.logpdf(b.numpy(), 0.0, 0.7).sum(1))
    else:
        lp = (scipy.stats.laplace.logpdf(w.numpy(), 0.1, 0.5).sum((1, 2))
              + scipy.stats.laplace.logpdf(b.numpy(), 0.1, 0.5).sum(1))
    _mc_check(torch.as_tensor(lq - lp), kl)
    assert pb.event_shape == layer.bias_mu.shape


def test_radial_kl_to_laplace_is_a_clear_error():
    layer = vnn.RadialLinear(3, 2, prior=Laplace(0.0, 1.0))
    with pytest.raises(NotImplementedError, match="prior"):
        layer.kl_divergence()


def test_radial_prior_kl_is_unbiased():
    torch.manual_seed(1)
    shape = (3, 4)
    prior = Radial(torch.zeros(shape, dtype=DT), torch.full(shape, 0.8, dtype=DT))
    bias_prior = Radial(torch.zeros(3, dtype=DT), torch.full((3,), 0.8, dtype=DT))
    layer = vnn.RadialLinear(4, 3, dtype=DT, prior=prior, bias_prior=bias_prior, sigma_init=0.3, prior_kl_samples=4)
    _perturb(layer, 0.2)
    with torch.no_grad():
        est = torch.stack([layer.kl_divergence() for _ in range(3000)])
    # reference: a separate, large Monte Carlo with the exact Radial densities
    qw, qb = layer.weight_posterior(), layer.bias_posterior()
    with torch.no_grad():
        w, b = qw.sample((200000,)), qb.sample((200000,))
        ref = float(((qw.log_prob(w) - prior.log_prob(w)) + (qb.log_prob(b) - bias_prior.log_prob(b))).mean())
    se = float(est.std()) / math.sqrt(est.numel())
    assert abs(float(est.mean()) - ref) < 5 * se + 0.02


@pytest.mark.parametrize("grouping", ["row", "column", "double"])
def test_rdp_kl_vs_monte_carlo(grouping):
    """Each factor's KL against Monte Carlo with SciPy's vMF, Gamma and inverse-Gamma densities."""
    torch.manual_seed(2)
    layer = vnn.RDPLinear(4, 3, dtype=DT, grouping=grouping, init_eps=0.2, prior_eps=0.4, lognormal_sigma=0.5)
    _perturb(layer, 0.1)
    layer.requires_grad_(False)
    n = 20000
    total_mc = np.zeros(n)
    with torch.no_grad():
        for _, f in layer._factors():
            qd = f.direction_posterior()
            x = qd.sample((n,)).numpy()  # (n, G, d)
            mu = f.loc.numpy()
            kq, kp = float(f.concentration), float(f.prior_concentration)
            for g in range(f.num_groups):
                total_mc += (scipy.stats.vonmises_fisher(mu[g], kq).logpdf(x[:, g])
                             - scipy.stats.vonmises_fisher(mu[g], kp).logpdf(x[:, g]))
            tl, tg = float(f.tau_local), float(f.tau_global)
            prior_pars = [(0.5, tl ** 2, "gamma"), (0.5, 1.0, "invgamma"), (0.5, tg ** 2, "gamma"), (0.5, 1.0, "invgamma")]
            for q, (alpha, scale, kind) in zip(f.radius_posteriors(), prior_pars):
                v = q.sample((n,)).numpy()
                lq = scipy.stats.lognorm.logpdf(v, float(q.scale.mean()) if q.scale.dim() == 0 else q.scale.numpy(),
                                                scale=np.exp(q.loc.numpy()))
                if kind == "gamma":
                    lp = scipy.stats.gamma.logpdf(v, alpha, scale=scale)  # rate 1/tau^2 = scale tau^2
                else:
                    lp = scipy.stats.invgamma.logpdf(v, alpha, scale=scale)
                total_mc += (lq - lp).reshape(n, -1).sum(1)
        kl_bias = float(torch.distributions.kl_divergence(layer.bias_posterior(),
                                                          layer.bias_prior.distribution((3,))))
        kl = float(layer.kl_divergence()) - kl_bias
    _mc_check(total_mc, kl)


@pytest.mark.parametrize("grouping,direction_prior", [("row", "vmf"), ("column", "vmf"), ("double", "vmf"),
                                                     ("double", "uniform")])
def test_rdp_kl_equals_registered_kls(grouping, direction_prior):
    """The layer's fused KL (one closed form per grouping) against the registered KLs of the factor
    distributions (VonMisesFisher, LogNormal || Gamma / InverseGamma objects) and the bias's Normal."""
    torch.manual_seed(3)
    layer = vnn.RDPLinear(5, 4, dtype=DT, grouping=grouping, direction_prior=direction_prior, init_eps=0.1,
                          lognormal_sigma=0.3)
    _perturb(layer, 0.2)
    with torch.no_grad():
        ref = torch.distributions.kl_divergence(layer.bias_posterior(), layer.bias_prior.distribution((4,)))
        for _, f in layer._factors():
            ref = ref + torch.distributions.kl_divergence(f.direction_posterior(),
                                                          f.direction_prior_distribution()).sum()
            for q, p in zip(f.radius_posteriors(), f.radius_priors()):
                ref = ref + torch.distributions.kl_divergence(q, p).sum()
        kl = layer.kl_divergence()
    torch.testing.assert_close(kl, ref, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("direction_prior", ["vmf", "uniform"])
def test_rdp_factor_kl_gradients(direction_prior):
    """The closed-form first derivative of a grouping's KL against finite differences (gradcheck), and
    the second derivatives (create_graph: autograd through the value) likewise."""
    from vmfdist.nn.rdp import _FactorKL
    torch.manual_seed(4)
    f = vnn.RDPLinear(6, 3, dtype=DT, direction_prior=direction_prior, init_eps=0.2).row
    _perturb(f, 0.3)
    consts = (f.prior_concentration, f.tau_local, f.tau_global, f.dim, direction_prior == "uniform")
    ins = tuple(t.detach().clone().requires_grad_(True) for t in (f.log_concentration, f.local_radius, f.global_radius))

    def kl(*a):
        return _FactorKL.apply(*a, *consts)

    assert torch.autograd.gradcheck(kl, ins)
    assert torch.autograd.gradgradcheck(kl, ins)


def test_rdp_sample_is_the_posterior_draw():
    """A grouping's sample with a seed equals the draw from its distribution objects with that seed:
    the vMF direction (VonMisesFisher.rsample of the normalised direction) times the radius
    exp((log a + log b + log s_a + log s_b) / 2), each log-normal drawn as loc + scale * eps."""
    torch.manual_seed(5)
    f = vnn.RDPLinear(7, 4, dtype=DT, init_eps=0.1, lognormal_sigma=0.3).row
    _perturb(f, 0.2)
    with torch.no_grad():
        f.direction.mul_(2.5)  # the direction parameter need not be a unit vector
        torch.manual_seed(6)
        w = f.sample(3)
        torch.manual_seed(6)
        x = f.direction_posterior().rsample((3,))
        eps = torch.randn(4, 3, f.num_groups, dtype=DT)
        log_r = 0.0
        for i, q in enumerate(f.radius_posteriors()):
            log_r = log_r + q.loc + q.scale * (eps[i] if i < 2 else eps[i, :, :1])
        ref = x * (0.5 * log_r).exp().unsqueeze(-1)
    torch.testing.assert_close(w, ref, rtol=1e-13, atol=1e-15)


def test_rdp_state_dict_with_unpacked_radius_keys_loads():
    """State dicts written when the eight radius parameters of a grouping were separate tensors
    (row.local_a_loc, ..., row.global_b_rho) load into the packed layout, and the former names remain
    views of it."""
    torch.manual_seed(7)
    a = vnn.RDPLinear(5, 3, dtype=DT, grouping="double")
    _perturb(a, 0.2)
    old = {}
    for k, v in a.state_dict().items():
        name = k.rsplit(".", 1)
        if len(name) == 2 and name[1] in ("local_radius", "global_radius"):
            kind = name[1].split("_")[0]
            for i, row in enumerate(("a_loc", "b_loc", "a_rho", "b_rho")):
                old[f"{name[0]}.{kind}_{row}"] = v[i].clone()
        else:
            old[k] = v
    assert "row.local_a_loc" in old and "row.local_radius" not in old
    b = vnn.RDPLinear(5, 3, dtype=DT, grouping="double")
    b.load_state_dict(old)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    assert torch.equal(b.row.local_b_rho, a.row.local_radius[3])
    assert torch.equal(b.column.global_a_loc, a.column.global_radius[0])


def test_prior_concentration_matches_scipy_root():
    for d, eps in [(9, 0.1), (64, 0.1), (576, 0.01), (3, 0.5)]:
        k = vnn.concentration_for_mean_length(d, 1 - eps)
        ratio = lambda kk: scipy.special.ive(d / 2, kk) / scipy.special.ive(d / 2 - 1, kk) - (1 - eps)  # noqa: E731
        r = 1 - eps
        guess = r * (d - r * r) / (1 - r * r)  # Banerjee et al.'s approximation brackets the root
        ref = scipy.optimize.brentq(ratio, 0.2 * guess, 5 * guess, xtol=1e-12, rtol=1e-13)
        assert k == pytest.approx(ref, rel=1e-9)


# ---------------------------------------------------------------------------------------------
# ELBO


def test_elbo_scaling_by_hand():
    torch.manual_seed(3)
    layer = vnn.MeanFieldLinear(4, 3, dtype=DT, prior=0.5, sigma_init=0.2)
    _perturb(layer, 0.3)
    model = nn.Sequential(layer)
    x = torch.randn(6, 4, dtype=DT)
    y = torch.tensor([0, 2, 1, 1, 0, 2])
    n_data = 1000
    elbo = vnn.ELBO(model, num_data=n_data, kl_weight=0.3)
    with vnn.deterministic(model, "mean"):
        out = model(x)
    loss = elbo(out, y).detach()
    # by hand (numpy): cross-entropy of the logits, closed-form Gaussian KL
    logits = out.detach().numpy()
    nll = np.mean(scipy.special.logsumexp(logits, axis=1) - logits[np.arange(6), y.numpy()])
    mu = np.concatenate([layer.weight_mu.detach().numpy().ravel(), layer.bias_mu.detach().numpy()])
    sig = np.concatenate([layer.weight_sigma.detach().numpy().ravel(), layer.bias_sigma.detach().numpy()])
    kl = np.sum(np.log(0.5 / sig) + (sig ** 2 + mu ** 2) / (2 * 0.25) - 0.5)
    assert float(elbo.nll) == pytest.approx(nll, rel=1e-12)
    assert float(elbo.kl) == pytest.approx(kl, rel=1e-12)
    assert float(loss) == pytest.approx(nll + 0.3 * kl / n_data, rel=1e-12)
    # samples stacked on a leading dimension are averaged
    out3 = torch.stack([out, 2 * out])
    loss3 = elbo(out3, y).detach()
    l2 = 2 * logits
    nll2 = np.mean(scipy.special.logsumexp(l2, axis=1) - l2[np.arange(6), y.numpy()])
    assert float(loss3) == pytest.approx(0.5 * (nll + nll2) + 0.3 * kl / n_data, rel=1e-12)


def test_elbo_schedule_and_parts():
    model = nn.Sequential(vnn.MeanFieldLinear(2, 2))
    elbo = vnn.ELBO(model, num_data=10, kl_weight=lambda step: min(1.0, step / 2))
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 1])
    weights = []
    for _ in range(4):
        elbo(model(x), y)
        weights.append(elbo.kl_weight_value)
    assert weights == [0.0, 0.5, 1.0, 1.0]
    elbo.eval()
    elbo(model(x), y)
    assert elbo.step == 4


@pytest.mark.parametrize("bad", [None, 0, -5, float("nan"), True, "100"])
def test_elbo_num_data_required(bad):
    model = nn.Sequential(vnn.MeanFieldLinear(2, 2))
    with pytest.raises((ValueError, TypeError), match="num_data"):
        vnn.ELBO(model, num_data=bad)


def test_elbo_num_data_is_keyword_required():
    with pytest.raises(TypeError):
        vnn.ELBO(nn.Sequential(vnn.MeanFieldLinear(2, 2)))  # noqa


def test_categorical_sync_free_path_gives_nan_and_elbo_names_the_target():
    """On a GPU the target range is not read back each step: out-of-range targets give NaN (the path
    forced here on the CPU), and ELBO's finiteness check then names the target."""
    lk = vnn.Categorical()
    out, t = torch.randn(2, 4, 3), torch.tensor([0, 2, 1, 7])
    got = lk._nll(out, t, sync_free=True)
    good = lk.nll(out[:, :3], t[:3])
    assert torch.isnan(got[:, 3]).all() and torch.equal(got[:, :3], good)
    model = nn.Sequential(vnn.MeanFieldLinear(2, 3))
    elbo = vnn.ELBO(model, num_data=10)
    lk_free = vnn.Categorical()
    lk_free.nll = lambda o, tt: vnn.Categorical._nll(lk_free, o, tt, sync_free=True)
    elbo.likelihood = lk_free
    with pytest.raises(ValueError, match=r"class indices must lie in \[0, 3\), got range \[0, 7\]"):
        elbo(torch.randn(4, 3), t)


def test_likelihood_shape_errors():
    model = nn.Sequential(vnn.MeanFieldLinear(2, 3))
    elbo = vnn.ELBO(model, num_data=10)
    with pytest.raises(ValueError, match="does not fit target"):
        elbo(torch.randn(4, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="class indices"):
        elbo(torch.randn(3, 3), torch.tensor([0, 1, 3]))
    with pytest.raises(ValueError, match="integer class indices"):
        elbo(torch.randn(3, 3), torch.tensor([0.0, 1.0, 2.0]))
    reg = vnn.ELBO(model, num_data=10, likelihood=vnn.Gaussian(0.5))
    with pytest.raises(ValueError, match="does not fit target"):
        reg(torch.randn(4, 3), torch.randn(4))
    gp = vnn.ELBO(model, num_data=10, likelihood=vnn.GammaPrecisionGaussian())
    with pytest.raises(ValueError, match="does not fit target"):
        gp(torch.randn(5, 1), torch.randn(4))


def test_gaussian_likelihoods_by_hand():
    torch.manual_seed(4)
    f, y = torch.randn(7, 1, dtype=DT), torch.randn(7, dtype=DT)
    g = vnn.Gaussian(0.3, learn_sigma=True)
    assert isinstance(g.log_sigma, nn.Parameter)
    nll = g.nll(f, y).mean()
    ref = -scipy.stats.norm.logpdf(y.numpy(), f.squeeze(-1).numpy(), 0.3).mean()
    assert float(nll.detach()) == pytest.approx(ref, rel=1e-6)
    gp = vnn.GammaPrecisionGaussian(6.0, 6.0)
    with torch.no_grad():
        gp.log_a1.fill_(math.log(3.0))
        gp.log_b1.fill_(math.log(2.0))
    # E_q[-log N(y | f, 1/tau)] by quadrature over tau ~ Gamma(3, rate 2)
    r2 = (y - f.squeeze(-1)).numpy() ** 2
    ref = [scipy.integrate.quad(lambda t: -scipy.stats.gamma.pdf(t, 3.0, scale=0.5)
                                * scipy.stats.norm.logpdf(0.0, np.sqrt(r), 1 / np.sqrt(t)), 0, np.inf)[0] for r in r2]
    assert gp.nll(f.to(torch.float32), y.to(torch.float32)).detach().double().numpy() == pytest.approx(np.array(ref), rel=1e-5)
    kl = float(gp.kl().detach())
    t = np.linspace(1e-6, 40, 400001)
    q = scipy.stats.gamma.pdf(t, 3.0, scale=0.5)
    ref_kl = np.trapezoid(q * (scipy.stats.gamma.logpdf(t, 3.0, scale=0.5) - scipy.stats.gamma.logpdf(t, 6.0, scale=1 / 6.0)), t)
    assert kl == pytest.approx(ref_kl, rel=1e-4)
    with pytest.raises(ValueError, match="sigma"):
        vnn.Gaussian(-1.0)
    with pytest.raises(ValueError, match="a0"):
        vnn.GammaPrecisionGaussian(0.0, 1.0)


def test_non_finite_parameter_detected():
    model = nn.Sequential(vnn.MeanFieldLinear(2, 2), nn.ReLU(), vnn.RadialLinear(2, 2))
    elbo = vnn.ELBO(model, num_data=10)
    x, y = torch.randn(3, 2), torch.tensor([0, 1, 1])
    elbo(model(x), y)
    with torch.no_grad():
        model[2].weight_mu[0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match=r"2\.weight_mu"):
        elbo(model(x), y)
    with pytest.raises(FloatingPointError, match="weight_mu"):
        vnn.check_finite(model)


# ---------------------------------------------------------------------------------------------
# layers: shapes, modes, folded evaluation, bad input

LAYERS = [
    (vnn.MeanFieldLinear, {"estimator": "reparam"}),
    (vnn.MeanFieldLinear, {"estimator": "local"}),
    (vnn.MeanFieldLinear, {"estimator": "flipout"}),
    (vnn.RadialLinear, {}),
    (vnn.RDPLinear, {"grouping": "row"}),
    (vnn.RDPLinear, {"grouping": "column"}),
    (vnn.RDPLinear, {"grouping": "double"}),
]
CONVS = [
    (vnn.MeanFieldConv2d, {"estimator": "reparam"}),
    (vnn.MeanFieldConv2d, {"estimator": "local"}),
    (vnn.MeanFieldConv2d, {"estimator": "flipout"}),
    (vnn.RadialConv2d, {}),
    (vnn.RDPConv2d, {"grouping": "row"}),
    (vnn.RDPConv2d, {"grouping": "double"}),
]


@pytest.mark.parametrize("cls,kw", LAYERS)
def test_linear_modes_and_gradients(cls, kw):
    torch.manual_seed(5)
    layer = cls(6, 4, **kw)
    x = torch.randn(5, 2, 6)
    y1, y2 = layer(x), layer(x)
    assert y1.shape == (5, 2, 4)
    assert not torch.equal(y1, y2)  # sampling
    (y1.sum() + layer.kl_divergence()).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())
    with vnn.deterministic(layer, "mean"):
        m1, m2 = layer(x), layer(x)
    assert torch.equal(m1, m2) and layer.mode == "sample"
    w, b = layer.point_weights("mean")
    torch.testing.assert_close(m1, torch.nn.functional.linear(x, w, b))
    layer.set_mode("mode")
    w, b = layer.point_weights("mode")
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, w, b))
    with pytest.raises(ValueError, match="mode"):
        layer.set_mode("median")
    with pytest.raises(ValueError, match="in_features"):
        layer(torch.randn(3, 5))


@pytest.mark.parametrize("cls,kw", LAYERS + CONVS)
def test_folded_samples_equal_per_sample_evaluation(cls, kw):
    """The batched evaluation of S weight samples equals applying each sample separately."""
    torch.manual_seed(6)
    if cls in (vnn.MeanFieldConv2d, vnn.RadialConv2d, vnn.RDPConv2d):
        groups = 1 if kw.get("grouping") == "double" else 2
        layer = cls(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=groups, dtype=DT, **kw)
        x = torch.randn(3, 4, 7, 6, dtype=DT)
    else:
        layer = cls(6, 4, dtype=DT, **kw)
        x = torch.randn(3, 6, dtype=DT)
    s = 4
    w, b = layer.sample_weights(s)
    assert w.shape == (s,) + tuple(layer.weight_mu.shape if hasattr(layer, "weight_mu") else layer.weight_shape)
    xs = x.repeat(s, *([1] * (x.dim() - 1)))
    folded = layer._apply_folded(xs, w, b, s)
    ref = torch.cat([layer._apply_weights(x, w[i], b[i]) for i in range(s)])
    torch.testing.assert_close(folded, ref)
    out = vnn.sample_forward(nn.Sequential(layer), x, s)
    assert out.shape[:2] == (s, 3)


@pytest.mark.parametrize("estimator", ["local", "flipout"])
def test_estimators_match_reparam_moments(estimator):
    """local / flipout outputs have the mean and variance of the weight-sampling output
    (exact values: mean f(x, mu), variance f(x^2, sigma^2) + sigma_b^2)."""
    torch.manual_seed(7)
    layer = vnn.MeanFieldLinear(5, 2, dtype=DT, estimator=estimator, sigma_init=0.5)
    x = torch.randn(1, 5, dtype=DT).expand(20000, 5)
    with torch.no_grad():
        out = layer(x)
        mean = torch.nn.functional.linear(x[:1], layer.weight_mu, layer.bias_mu)[0]
        var = torch.nn.functional.linear(x[:1] ** 2, layer.weight_sigma ** 2, layer.bias_sigma ** 2)[0]
    if estimator == "flipout":
        # one weight perturbation per call, shared by its rows (with random signs): the rows of a
        # call are dependent, the calls independent -- the i.i.d. draws are the per-call averages
        with torch.no_grad():
            out = torch.stack([layer(x[:50]) for _ in range(400)])  # (calls, rows, 2)
        for j in range(2):
            _mc_check(out[:, :, j].mean(1), mean[j])
            _mc_check(((out[:, :, j] - mean[j]) ** 2).mean(1), var[j])
        return
    for j in range(2):
        _mc_check(out[:, j], mean[j])
        _mc_check((out[:, j] - mean[j]) ** 2, var[j])


def test_bad_layer_arguments():
    with pytest.raises(ValueError, match="estimator"):
        vnn.MeanFieldLinear(2, 2, estimator="vanilla")
    with pytest.raises(ValueError, match="in_features"):
        vnn.RadialLinear(0, 2)
    with pytest.raises(ValueError, match="prior"):
        vnn.MeanFieldLinear(2, 2, prior=-1.0)
    with pytest.raises(TypeError, match="prior"):
        vnn.MeanFieldLinear(2, 2, prior="normal")
    with pytest.raises(ValueError, match="too small to group"):
        vnn.RDPLinear(1, 5, grouping="row")
    with pytest.raises(ValueError, match="too small to group"):
        vnn.RDPLinear(5, 1, grouping="double")
    vnn.RDPLinear(5, 1, grouping="row")  # a single row of 5 is fine
    with pytest.raises(ValueError, match="groups=1"):
        vnn.RDPConv2d(4, 4, 3, groups=2, grouping="column")
    with pytest.raises(ValueError, match="grouping"):
        vnn.RDPLinear(3, 3, grouping="block")
    with pytest.raises(ValueError, match="groups"):
        vnn.MeanFieldConv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="padding_mode"):
        vnn.RadialConv2d(3, 4, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="does not broadcast"):
        vnn.MeanFieldLinear(3, 2, prior=Normal(torch.zeros(5), 1.0)).kl_divergence()


# ---------------------------------------------------------------------------------------------
# state_dict round trips (priors included)


@pytest.mark.parametrize("cls,kw", LAYERS + CONVS)
def test_state_dict_round_trip(cls, kw):
    torch.manual_seed(8)
    conv = cls in (vnn.MeanFieldConv2d, vnn.RadialConv2d, vnn.RDPConv2d)
    args = (3, 4, 3) if conv else (5, 4)
    extra = {"tau_local": 0.05, "tau_global": 0.02, "prior_eps": 0.3, "bias_prior": 0.4} if "grouping" in kw \
        else {"prior": Normal(torch.tensor(0.2), torch.tensor(0.6)), "bias_prior": 0.3}
    a = cls(*args, **kw, **extra)
    _perturb(a, 0.05)
    b = cls(*args, **kw)  # default priors and a different initialisation
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 5, 5) if conv else torch.randn(2, 5)
    torch.testing.assert_close(b.kl_divergence(), a.kl_divergence())
    for use in ("mean", "mode"):
        a.set_mode(use)
        b.set_mode(use)
        torch.testing.assert_close(b(x), a(x))
    torch.manual_seed(9)
    ws = a.sample_weights(2)[0]
    torch.manual_seed(9)
    torch.testing.assert_close(b.sample_weights(2)[0], ws)


def test_elbo_state_dict_keeps_learned_noise():
    lik = vnn.GammaPrecisionGaussian(6.0, 6.0)
    with torch.no_grad():
        lik.log_a1.fill_(2.0)
    elbo = vnn.ELBO(nn.Linear(2, 1), num_data=5, likelihood=lik)
    other = vnn.ELBO(nn.Linear(2, 1), num_data=5, likelihood=vnn.GammaPrecisionGaussian(2.0, 3.0))
    other.load_state_dict(elbo.state_dict())
    assert float(other.likelihood.log_a1) == 2.0 and float(other.likelihood.a0) == 6.0


# ---------------------------------------------------------------------------------------------
# conversion


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2, bias=True),
            nn.ReLU(),
            nn.Conv2d(6, 5, (2, 3), padding=1, bias=False),
        )
        self.head = nn.Linear(5 * 5 * 4, 3)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


@pytest.mark.parametrize("kind", ["meanfield", "radial", "rdp"])
def test_to_bayesian_from_weights_reproduces_the_network(kind):
    torch.manual_seed(10)
    net = _Net().to(DT)
    x = torch.randn(2, 4, 8, 8, dtype=DT)
    ref = net(x)
    assert ref.shape == (2, 3)
    bnet = vnn.to_bayesian(net, kind, init="from_weights")
    convs = [m for m in bnet.modules() if isinstance(m, vnn.BayesianModule)]
    assert len(convs) == 3
    c0 = bnet.features[0]
    assert (c0.kernel_size, c0.stride, c0.padding, c0.dilation, c0.groups) == ((3, 5), (2, 1), (1, 2), (1, 2), 2)
    assert bnet.features[2].bias_mu is None
    with vnn.deterministic(bnet, "mean"):
        torch.testing.assert_close(bnet(x), ref)
    plain = vnn.to_deterministic(bnet, "mean")
    assert not any(isinstance(m, vnn.BayesianModule) for m in plain.modules())
    torch.testing.assert_close(plain(x), ref)
    assert isinstance(net.head, nn.Linear)  # the original is untouched
    if kind == "meanfield":
        torch.testing.assert_close(bnet.head.weight_sigma, (0.1 * net.head.weight.abs()).clamp_min(1e-6))


def test_to_bayesian_selection_and_errors():
    net = _Net()
    last = vnn.to_bayesian(net, "radial", last_layer_only=True)
    assert isinstance(last.head, vnn.RadialLinear) and isinstance(last.features[0], nn.Conv2d)
    only = vnn.to_bayesian(net, include=["features.*"], exclude=["features.2"])
    assert isinstance(only.features[0], vnn.MeanFieldConv2d) and type(only.features[2]) is nn.Conv2d
    assert type(only.head) is nn.Linear
    rdp = vnn.to_bayesian(net, "rdp", include="head", grouping="double")
    assert rdp.head.grouping == "double"
    with pytest.raises(ValueError, match="ReLU"):
        vnn.to_bayesian(net, include=["features.1"])
    with pytest.raises(ValueError, match="no module named"):
        vnn.to_bayesian(net, include=["decoder"])
    with pytest.raises(ValueError, match="kind"):
        vnn.to_bayesian(net, "dropout")
    with pytest.raises(ValueError, match="init"):
        vnn.to_bayesian(net, init="moped")
    with pytest.raises(ValueError, match="groups=1"):  # the grouped convolution cannot be column-grouped
        vnn.to_bayesian(net, "rdp", grouping="column")


# ---------------------------------------------------------------------------------------------
# predictive and metrics


def test_predict_classification_is_the_average_of_the_samples():
    torch.manual_seed(11)
    model = nn.Sequential(vnn.RadialLinear(4, 8, sigma_init=0.3), nn.ReLU(), vnn.MeanFieldLinear(8, 3, sigma_init=0.3))
    x = torch.randn(10, 4)
    torch.manual_seed(12)
    pred = vnn.predict(model, x, num_samples=7)
    torch.manual_seed(12)
    with torch.no_grad():
        logits = vnn.sample_forward(model, x, 7)
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(pred.probs, probs.mean(0))
    torch.testing.assert_close(pred.sample_probs, probs)
    assert model.training
    # the samples differ (not one weight draw repeated)
    assert (probs[0] - probs[1]).abs().max() > 1e-4
    ent = -(pred.probs * pred.probs.log()).sum(-1)
    torch.testing.assert_close(vnn.predictive_entropy(pred), ent)
    mi = ent + (probs * probs.log()).sum(-1).mean(0)
    torch.testing.assert_close(vnn.mutual_information(pred), mi)
    assert (vnn.mutual_information(pred) >= -1e-6).all()


def test_predict_regression_mixtures():
    torch.manual_seed(13)
    model = nn.Sequential(vnn.MeanFieldLinear(3, 1, sigma_init=0.5, dtype=DT))
    x, y = torch.randn(6, 3, dtype=DT), torch.randn(6, dtype=DT)
    lik = vnn.Gaussian(0.4)
    torch.manual_seed(14)
    pred = vnn.predict(model, x, 5, likelihood=lik)
    torch.manual_seed(14)
    with torch.no_grad():
        f = vnn.sample_forward(model, x, 5).squeeze(-1).numpy()  # (5, 6)
    ref = scipy.special.logsumexp(scipy.stats.norm.logpdf(y.numpy(), f, 0.4), axis=0) - math.log(5)
    np.testing.assert_allclose(pred.log_prob(y).numpy(), ref, rtol=1e-6)  # sigma is held in float32
    ll = vnn.log_likelihood(pred, 3.0 + 2.0 * y, y_mean=3.0, y_std=2.0)
    assert float(ll) == pytest.approx(float(np.mean(ref - math.log(2.0))), rel=1e-6)
    assert float(vnn.rmse(pred, 3.0 + 2.0 * y, 3.0, 2.0)) == pytest.approx(
        2.0 * float(np.sqrt(np.mean((f.mean(0) - y.numpy()) ** 2))), rel=1e-10)
    gp = vnn.GammaPrecisionGaussian()
    with torch.no_grad():
        gp.log_a1.fill_(math.log(4.0))
        gp.log_b1.fill_(math.log(2.0))
    torch.manual_seed(14)
    pt = vnn.predict(model, x, 5, likelihood=gp)
    ref_t = scipy.special.logsumexp(scipy.stats.t.logpdf(y.numpy(), 8.0, f, math.sqrt(0.5)), axis=0) - math.log(5)
    np.testing.assert_allclose(pt.log_prob(y).numpy(), ref_t, rtol=1e-6)


def test_metrics_against_peers():
    torchmetrics = pytest.importorskip("torchmetrics")
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    torch.manual_seed(15)
    logits = 3 * torch.randn(500, 4, dtype=DT)
    probs = torch.softmax(logits, -1)
    y = torch.randint(0, 4, (500,))
    ref_ece = torchmetrics.functional.classification.multiclass_calibration_error(probs, y, 4, n_bins=15, norm="l1")
    assert float(vnn.ece(probs, y)) == pytest.approx(float(ref_ece), rel=1e-6)
    assert float(vnn.accuracy(probs, y)) == pytest.approx(sklearn_metrics.accuracy_score(y, probs.argmax(-1)))
    onehot = np.eye(4)[y.numpy()]
    assert float(vnn.brier_score(probs, y)) == pytest.approx(np.mean(((probs.numpy() - onehot) ** 2).sum(1)))
    s_in = torch.randn(300).round(decimals=1)  # ties on purpose
    s_out = (torch.randn(200) + 0.7).round(decimals=1)
    labels = np.r_[np.zeros(300), np.ones(200)]
    ref_auc = sklearn_metrics.roc_auc_score(labels, np.r_[s_in.numpy(), s_out.numpy()])
    assert float(vnn.ood_auroc(s_in, s_out)) == pytest.approx(ref_auc, rel=1e-12)
    with pytest.raises(ValueError, match="y must have shape"):
        vnn.accuracy(probs, y[:10])
    with pytest.raises(TypeError, match="predict"):
        vnn.mutual_information(torch.distributions.Categorical(probs=probs))


def test_kl_divergence_of_model_sums_layers():
    model = nn.Sequential(vnn.MeanFieldLinear(3, 4), nn.ReLU(), nn.Sequential(vnn.RDPLinear(4, 2)))
    total = vnn.kl_divergence(model)
    torch.testing.assert_close(total, model[0].kl_divergence() + model[2][0].kl_divergence())
    assert float(vnn.kl_divergence(nn.Linear(2, 2))) == 0.0


# ---------------------------------------------------------------------------------------------
# pruning tools


def test_gap_threshold_and_counts():
    v = torch.tensor([-9.0, -8.5, -8.8, -1.0, -0.5, 0.2])
    assert vnn.gap_threshold(v) == pytest.approx(-4.75)
    assert vnn.gap_threshold(torch.tensor([0.0, 0.3, 0.5])) == -math.inf
    net = nn.Sequential(nn.Conv2d(1, 20, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(800, 500), nn.ReLU(), nn.Linear(500, 10))
    assert vnn.architecture(net) == "20-50-800-500"
    # the paper's formulas, written out for LeNet-5-Caffe on 28x28
    flops = (25 + 1) * 24 * 24 * 20 + (25 * 20 + 1) * 8 * 8 * 50 + 801 * 500 + 501 * 10
    assert vnn.count_flops(net, (1, 28, 28)) == flops
    assert vnn.count_parameters(net) == sum(p.numel() for p in net.parameters())
    bnet = vnn.to_bayesian(net, "rdp")
    assert vnn.count_parameters(bnet) == vnn.count_parameters(net)
    assert vnn.count_flops(bnet, (1, 28, 28)) == flops


def test_compress_removes_neurons_pruned_on_both_sides():
    torch.manual_seed(16)
    model = nn.Sequential(vnn.RDPLinear(6, 5, grouping="double"), nn.ReLU(), vnn.RDPLinear(5, 3, grouping="double"))
    with torch.no_grad():
        model[0].row.local_b_loc[[1, 3]] -= 30.0   # rows 1 and 3 of layer 0 pruned
        model[2].column.local_b_loc[[1, 4]] -= 30.0  # columns 1 and 4 of layer 2 pruned
        model[0].column.local_b_loc[2] -= 30.0       # input 2 pruned: zeroed, never removed
    small = vnn.compress(model, threshold=-7.0)
    assert small[0].weight.shape == (4, 6) and small[2].weight.shape == (3, 4)  # only neuron 1 goes
    full = vnn.to_deterministic(model, "mean")
    w0 = full[0].weight.detach().clone()
    w0[3] = 0.0
    w0[:, 2] = 0.0
    torch.testing.assert_close(small[0].weight, w0[[0, 2, 3, 4]])
    w2 = full[2].weight.detach().clone()
    w2[:, 4] = 0.0
    torch.testing.assert_close(small[2].weight, w2[:, [0, 2, 3, 4]])
    assert vnn.count_parameters(small) < vnn.count_parameters(model)
    with pytest.raises(TypeError, match="Sequential"):
        vnn.compress(_Net())


def test_predict_names_non_finite_inputs_and_outputs():
    torch.manual_seed(3)
    model = vnn.to_bayesian(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3)), "meanfield")
    x = torch.randn(5, 3)
    x[3, 1] = math.inf
    with pytest.raises(ValueError, match=r"x holds NaN or infinite values \(first in row 3\)"):
        vnn.predict(model, x)
    with torch.no_grad():
        model[2].weight_mu[1, 2] = math.nan
    with pytest.raises(FloatingPointError, match="outputs hold NaN or infinite values for a finite input"):
        vnn.predict(model, torch.randn(5, 3))
    with pytest.raises(FloatingPointError, match="2.weight_mu"):
        vnn.check_finite(model)  # what the message points to
    assert vnn.predict(model, torch.randn(0, 3)).probs.shape == (0, 3)  # nothing to check


def test_compress_refuses_thresholds_it_cannot_use():
    """A NaN threshold would prune every group (no log-mode exceeds NaN), a misspelt key would
    silently fall back to the gap rule, a string is no threshold: each is an error naming it."""
    torch.manual_seed(16)
    model = nn.Sequential(vnn.RDPLinear(6, 5, grouping="double"), nn.ReLU(), vnn.RDPLinear(5, 3))
    with pytest.raises(ValueError, match=r"compress: threshold is NaN"):
        vnn.compress(model, threshold=float("nan"))
    with pytest.raises(ValueError, match=r"threshold\['0.row'\] is NaN"):
        vnn.compress(model, threshold={"0.row": float("nan")})
    with pytest.raises(ValueError, match=r"names no grouping of the model: \['2.column'\].*'0.row', '0.column', '2.row'"):
        vnn.compress(model, threshold={"0.row": -7.0, "2.column": -7.0})  # layer 2 has rows only
    with pytest.raises(TypeError, match="threshold must be a real number, got str"):
        vnn.compress(model, threshold="-7")
    with pytest.raises(TypeError, match=r"threshold\['0.row'\] must be a real number, got NoneType"):
        vnn.compress(model, threshold={"0.row": None})
    # what it accepts: floats, ints, numpy and one-element tensor scalars, -inf and +inf
    ref = vnn.compress(model, threshold=-7.0)
    for t in (-7, np.float32(-7.0), torch.tensor(-7.0)):
        assert vnn.architecture(vnn.compress(model, threshold=t)) == vnn.architecture(ref)
    assert vnn.architecture(vnn.compress(model, threshold=-math.inf)) == "6-5"
    assert vnn.architecture(vnn.compress(model, threshold={"0.row": math.inf, "0.column": -math.inf,
                                                           "2.row": -math.inf}, rule="either")) == "6-1"


def test_gap_threshold_and_count_flops_refuse_bad_arguments():
    with pytest.raises(ValueError, match="min_separation must be a non-negative number, got nan"):
        vnn.gap_threshold(torch.tensor([1.0, 2.0, 30.0]), min_separation=math.nan)
    with pytest.raises(ValueError, match="min_separation must be a non-negative number, got -1"):
        vnn.gap_threshold(torch.tensor([1.0, 2.0, 30.0]), min_separation=-1)
    assert vnn.gap_threshold(torch.tensor([1.0, 2.0, 30.0]), min_separation=math.inf) == -math.inf
    net = nn.Sequential(nn.Linear(3, 2))
    for bad in ("3", (3.0,), (0,), 3, (True,)):
        with pytest.raises(ValueError, match="count_flops: input_shape must be a sequence of positive ints"):
            vnn.count_flops(net, bad)
    assert vnn.count_flops(net, torch.Size([3])) == vnn.count_flops(net, [3]) == 4 * 2


@pytest.mark.parametrize("grouping", ["row", "column", "double"])
def test_rdp_posterior_mean_matches_samples(grouping):
    """The closed-form E[W] (log-normal radius mean times A_d(kappa) mu) against the average of
    sampled weights, and the distribution object's shapes and mode."""
    torch.manual_seed(17)
    layer = vnn.RDPLinear(4, 3, dtype=DT, grouping=grouping, init_eps=0.3, lognormal_sigma=0.3)
    _perturb(layer, 0.1)
    q = layer.weight_posterior()
    assert isinstance(q, vnn.RDPPosterior) and q.event_shape == (3, 4)
    with torch.no_grad():
        w = q.rsample((40000,))
        assert w.shape == (40000, 3, 4)
        mean = q.mean
        torch.testing.assert_close(mean, layer.point_weights("mean")[0])
        torch.testing.assert_close(q.mode, layer.point_weights("mode")[0])
    for i in range(3):
        for j in range(4):
            _mc_check(w[:, i, j], mean[i, j])


# ---------------------------------------------------------------------------------------------
# mean-field layers: the KL computed in the sampling pass, and the fused ops


@pytest.mark.parametrize("cls", [vnn.MeanFieldLinear, vnn.MeanFieldConv2d])
def test_meanfield_kl_from_the_forward_pass(cls):
    """kl_divergence() after a sampling forward pass is the KL the op computed in that pass: the
    value of the registered Normal-Normal KL, and the gradients of out + KL equal those of the
    samples plus those of a separately computed KL."""
    args = (5, 3) if cls is vnn.MeanFieldLinear else (2, 3, 3)
    layer = cls(*args, dtype=DT, prior=0.7, bias_prior=Normal(torch.tensor(0.2, dtype=DT), torch.tensor(1.3, dtype=DT)),
                sigma_init=0.3)
    _perturb(layer, 0.2)
    x = torch.randn(4, 5, dtype=DT) if cls is vnn.MeanFieldLinear else torch.randn(4, 2, 5, 5, dtype=DT)
    ref_kl = (torch.distributions.kl_divergence(layer.weight_posterior(), layer.prior.distribution(layer.weight_mu.shape))
              + torch.distributions.kl_divergence(layer.bias_posterior(), layer.bias_prior.distribution((3,))))
    torch.manual_seed(3)
    out = layer(x)
    kl = layer.kl_divergence()
    torch.testing.assert_close(kl, ref_kl, rtol=1e-12, atol=0)
    (out.sin().sum() + kl).backward()
    fused = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    torch.manual_seed(3)  # the same samples, without the KL in the forward pass
    out2 = layer._apply_weights(x, *[t[0] for t in layer.sample_weights(1)])
    torch.testing.assert_close(out2, out, rtol=0, atol=0)
    (out2.sin().sum() + ref_kl).backward()
    for g, p in zip(fused, layer.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-10, atol=1e-12)


def test_meanfield_kl_cache_is_never_stale():
    """The KL kept from a forward pass is handed out once, only while its inputs are unchanged
    and its graph alive; every other call gives a fresh KL."""
    layer = vnn.MeanFieldLinear(4, 3, dtype=DT, sigma_init=0.2)
    x = torch.randn(6, 4, dtype=DT)

    def fresh():  # the registered Normal-Normal KL (the prior is N(0, 1))
        with torch.no_grad():
            return float(sum(torch.distributions.kl_divergence(Normal(m, torch.nn.functional.softplus(r)),
                                                               Normal(torch.zeros_like(m), 1.0)).sum()
                             for m, r in ((layer.weight_mu, layer.weight_rho), (layer.bias_mu, layer.bias_rho))))
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    # 1. an optimizer step in between: recomputed
    loss = layer(x).sum() + layer.kl_divergence()
    loss.backward()
    layer(x)
    opt.step()
    assert float(layer.kl_divergence().detach()) == pytest.approx(fresh(), rel=1e-12)
    # 2. the forward's graph freed by a backward through the samples: a KL that can be differentiated
    layer.zero_grad()
    layer(x).sum().backward()
    kl = layer.kl_divergence()
    kl.backward()
    assert all(torch.isfinite(p.grad).all() for p in layer.parameters())
    # 3. asked for twice: two KLs, both differentiable, the gradient counted twice
    layer.zero_grad()
    layer(x)
    k1, k2 = layer.kl_divergence(), layer.kl_divergence()
    (k1 + k2).backward()
    g2 = layer.weight_rho.grad.clone()
    layer.zero_grad()
    layer.kl_divergence().backward()
    torch.testing.assert_close(g2, 2 * layer.weight_rho.grad)
    # 4. without grad mode: a plain value; deepcopy and pickling with a kept KL
    layer(x)
    with torch.no_grad():
        k = layer.kl_divergence()
    assert not k.requires_grad and float(k) == pytest.approx(fresh(), rel=1e-12)
    layer(x)
    import copy
    import pickle
    other = copy.deepcopy(layer)
    assert float(other.kl_divergence().detach()) == pytest.approx(fresh(), rel=1e-12)
    layer(x)
    other = pickle.loads(pickle.dumps(layer))
    assert float(other.kl_divergence().detach()) == pytest.approx(fresh(), rel=1e-12)
    other(x)
    assert float(other.kl_divergence().detach()) == pytest.approx(fresh(), rel=1e-12)
    # 5. a state_dict load in between (an in-place copy): recomputed
    layer(x)
    with torch.no_grad():
        layer.weight_mu.add_(1.0)
    assert float(layer.kl_divergence().detach()) == pytest.approx(fresh(), rel=1e-12)


@pytest.mark.parametrize("cls,kw", [(vnn.MeanFieldConv2d, {}), (vnn.RadialConv2d, {}), (vnn.RDPConv2d, {}),
                                    (vnn.MeanFieldConv2d, {"padding": "same"})])
def test_shared_input_samples_equal_per_sample_evaluation(cls, kw):
    """The stacked evaluation of S weight samples on one input (im2col, grouped, strided, dilated,
    padded) equals applying each sample separately; linear layers on inputs with extra dims too."""
    torch.manual_seed(8)
    if "padding" in kw:
        layer = cls(4, 6, 3, dtype=DT, **kw)
    else:
        groups = 1 if cls is vnn.RDPConv2d else 2
        layer = cls(4, 6, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=groups, dtype=DT)
    x = torch.randn(3, 4, 7, 6, dtype=DT)
    s = 4
    w, b = layer.sample_weights(s)
    shared = layer._apply_shared(x, w, b, s)
    ref = torch.cat([layer._apply_weights(x, w[i], b[i]) for i in range(s)])
    torch.testing.assert_close(shared, ref)
    for lcls in (vnn.MeanFieldLinear, vnn.RadialLinear, vnn.RDPLinear):
        lin = lcls(6, 4, dtype=DT)
        xl = torch.randn(3, 2, 6, dtype=DT)
        w, b = lin.sample_weights(s)
        torch.testing.assert_close(lin._apply_shared(xl, w, b, s), torch.cat([lin._apply_weights(xl, w[i], b[i])
                                                                               for i in range(s)]))


def test_predict_first_layer_local_reparameterisation_is_exact_per_example():
    """predict's first MeanFieldLinear on a batch of vectors uses the local reparameterisation:
    its outputs for one example have mean x mu^T + mu_b and variance x^2 sigma^2 + sigma_b^2,
    independent across units, as with sampled weights; the predictive's per-example moments
    agree with the per-sample loop's within standard errors."""
    torch.manual_seed(9)
    first = vnn.MeanFieldLinear(5, 3, dtype=DT, sigma_init=0.4)
    _perturb(first, 0.2)
    assert vnn._base._local_is_cheaper(2, 5, 3, 4000)
    x = torch.randn(2, 5, dtype=DT)
    with torch.no_grad():
        h = first._forward_shared(x, 4000).reshape(4000, 2, 3)
        mean = torch.nn.functional.linear(x, first.weight_mu, first.bias_mu)
        var = torch.nn.functional.linear(x ** 2, first.weight_sigma ** 2, first.bias_sigma ** 2)
    for i in range(2):
        for j in range(3):
            _mc_check(h[:, i, j], mean[i, j])
            _mc_check((h[:, i, j] - mean[i, j]) ** 2, var[i, j])
        c = torch.corrcoef(h[:, i, :].T)  # independent units
        assert (c - torch.eye(3, dtype=DT)).abs().max() < 5 / math.sqrt(4000)
    # the whole predictive: per-example means and variances of the logits, batched vs loop
    model = nn.Sequential(first, nn.ReLU(), vnn.MeanFieldLinear(3, 4, dtype=DT, sigma_init=0.3))
    n = 3000
    with torch.no_grad():
        batched = vnn.model._predictive_forward(model, x, n)  # (n, 2, 4)
        looped = torch.stack([model(x) for _ in range(n)])
    for i in range(2):
        for j in range(4):
            a, b = batched[:, i, j], looped[:, i, j]
            se = math.sqrt(a.var() / n + b.var() / n)
            assert abs(float(a.mean() - b.mean())) <= 5 * se
            va, vb = (a - a.mean()) ** 2, (b - b.mean()) ** 2
            assert abs(float(va.mean() - vb.mean())) <= 5 * math.sqrt(va.var() / n + vb.var() / n)


def test_predict_uses_the_shared_first_layer_only_where_it_is_safe():
    """Stacked weights for a first Radial / conv layer (same numbers as sample_forward with the
    same seed), the plain folded evaluation when the first child is a container."""
    torch.manual_seed(10)
    conv = nn.Sequential(vnn.MeanFieldConv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), vnn.RadialLinear(64, 3))
    x = torch.randn(5, 1, 4, 4)
    torch.manual_seed(11)
    p = vnn.predict(conv, x, 6)
    torch.manual_seed(11)
    with torch.no_grad():
        ref = torch.softmax(vnn.sample_forward(conv, x, 6), -1)
    torch.testing.assert_close(p.sample_probs, ref, rtol=1e-5, atol=1e-6)
    nested = nn.Sequential(nn.Sequential(vnn.MeanFieldLinear(4, 3)), nn.ReLU())
    assert vnn.model._shared_prefix(nested) is None
    assert vnn.model._shared_prefix(nn.Sequential(nn.Flatten(), vnn.RadialLinear(4, 3)))[0] == 1


@pytest.mark.parametrize("cls", [vnn.RadialLinear, vnn.RadialConv2d])
def test_radial_kl_fused_form_equals_the_closed_form(cls):
    """The Radial layers' KL through the fused mean-field KL (to N(m, D s^2)) plus its correction
    equals the registered closed form Radial || Independent(Normal), value and gradients."""
    torch.manual_seed(12)
    args = (5, 3) if cls is vnn.RadialLinear else (2, 3, 3)
    prior = Normal(torch.tensor(0.3, dtype=DT), torch.tensor(1.4, dtype=DT))
    layer = cls(*args, dtype=DT, sigma_init=0.3, prior=prior)
    _perturb(layer, 0.2)
    kl = layer.kl_divergence()
    ref = (torch.distributions.kl_divergence(layer.weight_posterior(), layer.prior.distribution(layer.weight_mu.shape))
           + torch.distributions.kl_divergence(layer.bias_posterior(), layer.bias_prior.distribution((3,))))
    torch.testing.assert_close(kl, ref, rtol=1e-12, atol=0)
    g = torch.autograd.grad(kl, list(layer.parameters()))
    r = torch.autograd.grad(ref, list(layer.parameters()))
    for a, b in zip(g, r):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_predict_first_radial_layer_per_example_draw_is_exact():
    """predict's first RadialLinear on a batch of vectors draws each example's outputs from their
    joint law (no weight samples): mean x mu^T, variance a_o^2 / D with a_o = |x * sigma_o|, and
    the coupling of the outputs through the shared radius and norm,
    E[n_o^2 n_o'^2] = 3 a_o^2 a_o'^2 / (D (D + 2)) (uniform direction on the sphere of dimension D,
    radius N(0, 1)), within standard errors; and, where predict uses it, the same distribution as
    the stacked weight samples (two-sample KS tests per output and on the squared distance from the
    mean, which detects outputs drawn independently)."""
    torch.manual_seed(21)
    small = vnn.RadialLinear(2, 3, bias=False, dtype=DT, sigma_init=0.7)  # D = 6: small enough to see D + 2
    _perturb(small, 0.3)
    x = torch.randn(2, 2, dtype=DT)
    n = 40000
    with torch.no_grad():
        y = small._sample_per_example(x, n).reshape(n, 2, 3)
        m = torch.nn.functional.linear(x, small.weight_mu)
        a2 = torch.nn.functional.linear(x * x, small.weight_sigma ** 2)
    d = 6
    noise = y - m
    for i in range(2):
        for o in range(3):
            _mc_check(noise[:, i, o], 0.0)
            _mc_check(noise[:, i, o] ** 2, a2[i, o] / d)
        for o, p in ((0, 1), (0, 2), (1, 2)):
            _mc_check(noise[:, i, o] ** 2 * noise[:, i, p] ** 2, 3 * a2[i, o] * a2[i, p] / (d * (d + 2)))
    # the layer predict uses it for: stacked weights cost more here
    big = vnn.RadialLinear(12, 3, dtype=DT, sigma_init=0.5)
    _perturb(big, 0.3)
    assert vnn._base._local_is_cheaper(2, 12, 3, 20000, per_example=9)
    assert not vnn._base._local_is_cheaper(400, 12, 3, 20000, per_example=9)
    x = torch.randn(2, 12, dtype=DT)
    n = 20000
    with torch.no_grad():
        fast = big._forward_shared(x, n).reshape(n, 2, 3)
        w, b = big.sample_weights(n)
        ref = big._apply_shared(x, w, b, n).reshape(n, 2, 3)
        m = torch.nn.functional.linear(x, big.weight_mu, big.bias_mu)
    for i in range(2):
        dist = lambda h: ((h[:, i] - m[i]) ** 2).sum(-1).numpy()  # noqa: E731
        assert scipy.stats.ks_2samp(dist(fast), dist(ref)).pvalue > 1e-3
        for o in range(3):
            assert scipy.stats.ks_2samp(fast[:, i, o].numpy(), ref[:, i, o].numpy()).pvalue > 1e-3


def test_predict_sample_passes():
    """predict evaluates its samples in passes: sizes as even as possible, automatic only on the
    CPU for stacked weights over CPU_PASS_BYTES; passes of one sample through a model without a
    shared first layer give exactly the per-sample loop's outputs (same draws, same order)."""
    from vmfdist.nn._base import CPU_PASS_BYTES, _pass_sizes
    cpu = torch.device("cpu")
    assert _pass_sizes(32, 1000, cpu) == [32]
    assert _pass_sizes(32, 1000, cpu, 5) == [5, 5, 5, 5, 4, 4, 4]
    assert _pass_sizes(32, CPU_PASS_BYTES // 10, cpu) == [8, 8, 8, 8]
    assert _pass_sizes(32, CPU_PASS_BYTES, cpu) == [1] * 32
    assert _pass_sizes(32, 4 * CPU_PASS_BYTES, torch.device("meta")) == [32]
    assert _pass_sizes(3, 10, cpu, 8) == [3]
    torch.manual_seed(31)
    model = nn.Sequential(nn.Sequential(vnn.RadialLinear(6, 5, sigma_init=0.2)), nn.ReLU(),
                          vnn.RDPLinear(5, 4), nn.ReLU(), vnn.MeanFieldLinear(4, 3, sigma_init=0.2)).eval()
    x = torch.randn(7, 6)
    torch.manual_seed(32)
    p = vnn.predict(model, x, 5, samples_per_pass=1)
    torch.manual_seed(32)
    with torch.no_grad():
        ref = torch.stack([torch.softmax(model(x), -1) for _ in range(5)])
    torch.testing.assert_close(p.sample_probs, ref)
    # a shared first layer and the rest of the model, each in passes
    seq = nn.Sequential(vnn.RadialConv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), vnn.RDPLinear(64, 3)).eval()
    sizes = []
    for m in (seq[0], seq[3]):
        orig = m.sample_weights
        m.sample_weights = lambda n, orig=orig: (sizes.append(n), orig(n))[1]
    p = vnn.predict(seq, torch.randn(5, 1, 4, 4), 7, samples_per_pass=3)
    assert sizes == [3, 2, 2, 3, 2, 2] and p.sample_probs.shape == (7, 5, 3)
    assert torch.isfinite(p.sample_probs).all()
    with pytest.raises(ValueError, match="samples_per_pass"):
        vnn.predict(seq, torch.randn(5, 1, 4, 4), 7, samples_per_pass=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["meanfield", "radial", "rdp"])
def test_predict_in_half_precision(dtype, kind):
    """predict on half-precision models, a batch small enough for the per-example first-layer
    draws (torch has no half gamma sampler: the Radial draws run in float32): finite
    probabilities of the model's dtype that sum to one."""
    torch.manual_seed(33)
    model = vnn.to_bayesian(nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype), kind)
    assert vnn._base._local_is_cheaper(2, 64, 8, 16, per_example=9)
    p = vnn.predict(model, torch.randn(2, 64, dtype=dtype), 16)
    assert p.sample_probs.shape == (16, 2, 3) and p.probs.dtype == dtype
    assert torch.isfinite(p.sample_probs).all()
    torch.testing.assert_close(p.probs.float().sum(-1), torch.ones(2), rtol=0, atol=1e-2)


def test_to_bayesian_says_what_it_leaves_deterministic():
    """Layers with weights that are not converted (Conv1d, LSTM, a subclass of nn.Linear) are named in
    a warning; a model with nothing to convert gets one too; a plain MLP or a normalisation layer none."""
    import warnings

    class MyLinear(nn.Linear):
        pass

    with pytest.warns(UserWarning, match=r"'0' \(Conv1d\)"):
        vnn.to_bayesian(nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 2)))
    with pytest.warns(UserWarning, match=r"'the model' \(LSTM\)"):
        vnn.to_bayesian(nn.LSTM(3, 4))
    with pytest.warns(UserWarning, match=r"'1' \(MyLinear\)"):
        m = vnn.to_bayesian(nn.Sequential(nn.Linear(3, 4), MyLinear(4, 2)))
    assert isinstance(m[0], vnn.MeanFieldLinear) and type(m[1]) is MyLinear
    with pytest.warns(UserWarning, match="no nn.Linear or nn.Conv2d"):
        vnn.to_bayesian(nn.Sequential(nn.ReLU()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vnn.to_bayesian(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Linear(3, 2)))
        vnn.to_bayesian(nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 2)), exclude=["0"])


# ---- the predictive and the metrics under bad input (issue 22) -----------------------------------------------
def _bnn(out=3):
    torch.manual_seed(0)
    return nn.Sequential(vnn.MeanFieldLinear(4, 8), nn.ReLU(), vnn.MeanFieldLinear(8, out))


def test_predict_refuses_what_it_would_get_wrong():
    x = torch.randn(5, 4)
    with pytest.raises(ValueError, match=r"Categorical, which needs \(batch, classes >= 2\).*likelihood=Gaussian"):
        vnn.predict(_bnn(out=1), x, 4)  # a regression output: a categorical over one class (or the batch)
    pred = vnn.predict(_bnn(out=1), x, 4, vnn.Gaussian(sigma=0.5))
    assert pred.mean.shape == (5,)
    bad = x.clone()
    bad[3, 2] = float("nan")
    with pytest.raises(ValueError, match=r"x holds NaN or infinite values \(first in row 3\)"):
        vnn.predict(_bnn(), bad, 4)
    with pytest.raises(ValueError, match=r"num_samples x batch = 5000000000000 exceeds 2\*\*31"):
        vnn.predict(_bnn(), x, 10 ** 12)  # used to run for hours
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        vnn.predict(_bnn(), x, 0)


def test_metrics_refuse_logits_nan_and_bad_labels_and_take_probability_tensors():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(20, 4, generator=g, dtype=torch.float64) * 3
    y = torch.randint(0, 4, (20,), generator=g)
    p = logits.softmax(-1)
    for metric in (vnn.ece, vnn.accuracy, vnn.brier_score, vnn.nll):
        with pytest.raises(ValueError, match="must be class probabilities"):
            metric(logits, y)  # ece(logits) used to be 3.18
        nan = p.clone()
        nan[2, 1] = float("nan")
        with pytest.raises(ValueError, match="NaN or infinite"):
            metric(nan, y)
        with pytest.raises(ValueError, match="integer class indices"):
            metric(p, y.to(torch.float64))
        with pytest.raises(ValueError, match=r"class indices in \[0, 4\), got values from 0 to 4"):
            metric(p, torch.where(y == 3, 4, y).clamp_min(0))
    # a tensor of probabilities is a predictive for nll too (it used to raise AttributeError)
    ref = -sum(math.log(float(p[i, int(y[i])])) for i in range(20)) / 20
    assert abs(float(vnn.nll(p, y)) - ref) < 1e-12
    assert float(vnn.nll(torch.distributions.Categorical(probs=p), y)) == pytest.approx(ref, rel=1e-12)
    assert float(vnn.accuracy(p, y.to(torch.uint8))) == float((p.argmax(-1) == y).double().mean())


def test_elbo_refuses_an_ambiguous_square_output_and_warns_without_bayesian_layers():
    model = nn.Sequential(vnn.MeanFieldLinear(3, 4))
    elbo = vnn.ELBO(model, num_data=10, likelihood=vnn.Gaussian(1.0))
    x, y = torch.randn(4, 3), torch.randn(4)
    with pytest.raises(ValueError, match=r"output of shape \(4, 4\) against target of shape \(4,\) is ambiguous"):
        elbo(model(x), y)  # four outputs per example, read as four samples before
    out = vnn.sample_forward(nn.Sequential(vnn.MeanFieldLinear(3, 1)), x, 4)  # (S, B, 1) samples are fine
    assert elbo(out, y).dim() == 0
    with pytest.warns(UserWarning, match="no Bayesian layers"):
        vnn.ELBO(nn.Linear(3, 2), num_data=10)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vnn.ELBO(model, num_data=10)
        vnn.ELBO(nn.Linear(3, 1), num_data=10, likelihood=vnn.GammaPrecisionGaussian())  # a latent of its own


def test_compress_slices_a_batch_norm_after_flatten_and_refuses_layer_norm():
    """A BatchNorm1d after Flatten is sliced over the flattened features of the removed channels (it
    was left whole, so the compressed model crashed at first use); a LayerNorm between pruned layers
    is refused by name (it was accepted and not resized); the result computes what the masked network
    computes."""
    torch.manual_seed(3)
    model = nn.Sequential(vnn.RDPConv2d(1, 4, 3, grouping="double"), nn.ReLU(), nn.Flatten(),
                          nn.BatchNorm1d(4 * 2 * 2), vnn.RDPLinear(16, 3, grouping="double")).double()
    with torch.no_grad():
        model[3].running_mean.uniform_(-1, 1)
        model[3].running_var.uniform_(0.5, 2)
        model[3].weight.uniform_(0.5, 1.5)
        model[3].bias.uniform_(-1, 1)
        model[0].row.local_b_loc[[1, 2]] -= 30.0  # output channels 1 and 2 pruned
        model[4].column.local_b_loc[4:12] -= 30.0  # and the features they feed (2 x 2 each)
    small = vnn.compress(model, threshold=-7.0).eval()
    assert small[0].weight.shape[0] == 2 and small[3].num_features == 8 and small[4].weight.shape == (3, 8)
    assert small[3].running_mean.dtype == torch.float64
    x = torch.randn(5, 1, 4, 4, dtype=torch.float64)
    full = vnn.to_deterministic(model, "mean").eval()
    with torch.no_grad():  # the reference: the full network with the pruned channels' outputs removed
        h = full[2](full[1](full[0](x)))
        keep = torch.ones(16, dtype=torch.bool)
        keep[4:12] = False
        ref = full[4].weight[:, keep] @ full[3](h)[:, keep].T
    torch.testing.assert_close(small(x), ref.T + full[4].bias, rtol=1e-12, atol=1e-12)
    ln = nn.Sequential(vnn.RDPLinear(6, 5, grouping="double"), nn.LayerNorm(5), vnn.RDPLinear(5, 3, grouping="double"))
    with torch.no_grad():
        ln[0].row.local_b_loc[1] -= 30.0
        ln[2].column.local_b_loc[1] -= 30.0
    with pytest.raises(ValueError, match=r"compress: LayerNorm '1' normalises over several features"):
        vnn.compress(ln, threshold=-7.0)


@pytest.mark.parametrize("make", [lambda **k: vnn.MeanFieldLinear(4, 3, **k), lambda **k: vnn.RadialLinear(4, 3, **k),
                                  lambda **k: vnn.RDPLinear(4, 3, **k), lambda **k: vnn.MeanFieldConv2d(2, 3, 3, **k),
                                  lambda **k: vnn.RadialConv2d(2, 3, 3, **k), lambda **k: vnn.RDPConv2d(2, 3, 3, **k)])
def test_layers_honour_device_for_every_parameter_and_buffer(make):
    """device='meta' (large models are built there and materialised later): the priors' buffers used to
    stay on the CPU, and RDP layers could not be built at all."""
    m = make(device="meta")
    assert {t.device.type for t in list(m.parameters()) + list(m.buffers())} == {"meta"}
    d = make(dtype=torch.float64)  # and dtype=: the priors' buffers too (they stayed float32)
    assert {t.dtype for t in list(d.parameters()) + list(d.buffers()) if t.is_floating_point()} == {torch.float64}
    real = m.to_empty(device="cpu")
    assert {t.device.type for t in list(real.parameters()) + list(real.buffers())} == {"cpu"}


def test_to_bayesian_on_the_meta_device_runs():
    net = vnn.to_bayesian(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).to("meta"))
    assert {t.device.type for t in list(net.parameters()) + list(net.buffers())} == {"meta"}
    assert net(torch.randn(5, 4, device="meta")).shape == (5, 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("make", [lambda **k: vnn.MeanFieldLinear(300, 200, **k), lambda **k: vnn.RadialLinear(300, 200, **k),
                                  lambda **k: vnn.RDPLinear(30, 20, **k), lambda **k: vnn.MeanFieldConv2d(20, 30, 3, **k)])
def test_half_precision_layers_have_a_finite_float32_kl(make, dtype):
    """A float16 layer's KL used to overflow to inf (mean-field) or be NaN at initialisation (RDP):
    it is computed in float32, equal to the KL of the same parameters held in float32, and its
    gradient reaches the half-precision parameters."""
    torch.manual_seed(0)
    low = make(dtype=dtype)
    torch.manual_seed(0)
    ref = make(dtype=torch.float32)
    with torch.no_grad():
        for p, q in zip(low.parameters(), ref.parameters()):
            q.copy_(p.float())
        for b, c in zip(low.buffers(), ref.buffers()):
            c.copy_(b.float())
    kl, kl_ref = low.kl_divergence(), ref.kl_divergence()
    assert kl.dtype == torch.float32 and math.isfinite(float(kl))
    assert float(kl) == pytest.approx(float(kl_ref), rel=1e-6)
    kl.backward()
    grads = [p.grad for p in low.parameters() if p.grad is not None]
    assert grads and all(g.dtype == dtype and bool(torch.isfinite(g).all()) for g in grads)


def test_elbo_takes_any_integer_labels_and_refuses_bool():
    model = nn.Sequential(vnn.MeanFieldLinear(3, 4))
    elbo = vnn.ELBO(model, num_data=10)
    x, y = torch.randn(6, 3), torch.tensor([0, 1, 2, 3, 1, 0])
    out = model(x)
    ref = float(torch.nn.functional.cross_entropy(out, y))
    for dt in (torch.uint8, torch.int8, torch.int16, torch.int32):
        assert float(elbo.likelihood.nll(out, y.to(dt)).mean()) == pytest.approx(ref, rel=1e-6)
    with pytest.raises(ValueError, match="integer class indices, got dtype torch.bool"):
        elbo(out, y > 1)


def test_param_groups_let_a_short_rdp_run_prune():
    """vmfdist.nn.param_groups: with one Adam rate of 1e-3 a 60-epoch RDP run of a 64-100-100-10 MLP on
    scikit-learn's digits prunes nothing (no gap in the log-modes); with the radius parameters at 1e-2
    it removes hidden neurons, at a test error still within a point of the unpruned run's."""
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target)
    perm = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:1400], perm[1400:]
    results = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for radius_lr in (None, 1e-2):
            torch.manual_seed(0)
            base = nn.Sequential(nn.Linear(64, 100), nn.ReLU(), nn.Linear(100, 100), nn.ReLU(), nn.Linear(100, 10))
            model = vnn.to_bayesian(base, "rdp")
            groups = model.parameters() if radius_lr is None else vnn.param_groups(model, radius_lr=radius_lr)
            opt = torch.optim.Adam(groups, lr=1e-3)
            elbo = vnn.ELBO(model, num_data=len(tr), check_finite=False)
            gen = torch.Generator().manual_seed(1)
            for _ in range(60):
                p = torch.randperm(len(tr), generator=gen)
                for i in range(0, len(tr), 100):
                    idx = tr[p[i:i + 100]]
                    loss = elbo(model(X[idx]), y[idx])
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
            small = vnn.compress(model)
            with torch.no_grad():
                err = float((small(X[te]).argmax(-1) != y[te]).float().mean())
            results[radius_lr] = (vnn.count_parameters(small) / vnn.count_parameters(base), err)
    finally:
        torch.set_num_threads(threads)
    assert results[None][0] == 1.0, results
    assert results[1e-2][0] < 0.9, results
    assert results[1e-2][1] < results[None][1] + 0.01, results
    with pytest.raises(ValueError, match="no RDP layers"):
        vnn.param_groups(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="radius_lr must be"):
        vnn.param_groups(model, radius_lr=0.0)
