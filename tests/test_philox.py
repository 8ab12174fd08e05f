"""Tests of the counter-based random numbers (csrc/include/vmfdist/philox.h).

* known answers of Philox4x32-R from Random123, and an independent NumPy
  implementation of the block function, of vmfdist's (seed, offset, index) ->
  (key, counter) mapping and of the uniform / Box-Muller conversions;
* goodness of fit and moments of the variates with fixed seeds, tolerances from
  standard errors;
* determinism across thread counts, torch.Generator semantics, opcheck, errors.
"""
import math
import subprocess

import numpy as np
import pytest
import torch
from scipy import stats

import vmfdist  # noqa: F401  (registers the ops)
from vmfdist.random import MAX_OFFSET, philox_normal, philox_uniform

from .drivers import compile_driver

from vmfdist._ops import lib  # noqa: E402
U32 = 0xFFFFFFFF
FLOAT_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SIGNIFICAND_BITS = {torch.float64: 53, torch.float32: 24, torch.float16: 11, torch.bfloat16: 8}

needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch._C._dispatch_has_kernel_for_dispatch_key("vmfdist::philox4x32", "CUDA")),
    reason="needs a CUDA device and a CUDA build of vmfdist")


@pytest.fixture(autouse=True)
def _restore_rng_state():
    with torch.random.fork_rng(devices=[]):
        yield


# ----------------------------------------------------------------------------
# (a) known-answer vectors
#
# From Random123's tests/kat_vectors (https://github.com/DEShawResearch/random123,
# release v1.14.0; the same lines on main), the "philox4x32 7" and
# "philox4x32 10" lines.  Columns: rounds, CTR (4 words), KEY (2 words),
# EXPECTED (4 words).
KAT = """
philox4x32 7 00000000 00000000 00000000 00000000 00000000 00000000   5f6fb709 0d893f64 4f121f81 4f730a48
philox4x32 7 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   5207ddc2 45165e59 4d8ee751 8c52f662
philox4x32 7 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   4dfccaba 190a87f0 c47362ba b6b5242a
philox4x32 10 00000000 00000000 00000000 00000000 00000000 00000000   6627e8d5 e169c58d bc57ac4c 9b00dbd8
philox4x32 10 ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff   408f276d 41c83b0e a20bc7c6 6d5451fd
philox4x32 10 243f6a88 85a308d3 13198a2e 03707344 a4093822 299f31d0   d16cfe09 94fdcceb 5001e420 24126ea1
"""


def _kat_rows():
    for line in KAT.strip().splitlines():
        f = line.split()
        words = [int(x, 16) for x in f[2:]]
        yield int(f[1]), words[0:4], words[4:6], words[6:10]


@pytest.mark.parametrize("rounds,ctr,key,expected", list(_kat_rows()))
def test_known_answer_vectors(rounds, ctr, key, expected):
    out = lib.philox4x32(torch.tensor([ctr]), torch.tensor([key]), rounds)
    assert out.dtype == torch.int64
    assert out[0].tolist() == expected


def test_default_rounds_is_ten():
    rounds, ctr, key, expected = list(_kat_rows())[-1]
    assert rounds == 10
    assert lib.philox4x32(torch.tensor([ctr]), torch.tensor([key]))[0].tolist() == expected


# ----------------------------------------------------------------------------
# (b) an independent NumPy reference
MASK = np.uint64(U32)


def np_philox4x32(ctr, key, rounds=10):
    """Philox4x32-R on arrays: ctr (n, 4), key (n, 2) of uint32 values.

    Written from Salmon et al. (2011), bumping the key *after* each round (the
    header bumps it before every round but the first: same schedule, different
    code)."""
    c0, c1, c2, c3 = (np.asarray(ctr, dtype=np.uint64)[:, j] for j in range(4))
    k0, k1 = (np.asarray(key, dtype=np.uint64)[:, j] for j in range(2))
    for _ in range(rounds):
        p0 = np.uint64(0xD2511F53) * c0  # < 2**64: exact in uint64
        p1 = np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & MASK, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & MASK
        k0 = (k0 + np.uint64(0x9E3779B9)) & MASK
        k1 = (k1 + np.uint64(0xBB67AE85)) & MASK
    return np.stack([c0, c1, c2, c3], axis=1)


def np_stream_block0(seed, offset, n):
    """Block 0 of the streams (seed, offset, i), i < n, per the mapping in philox.h."""
    seed %= 2 ** 64
    i = np.arange(n, dtype=np.uint64)
    off = np.uint64(offset)
    ctr = np.stack([np.zeros(n, np.uint64), i & MASK,
                    ((i >> np.uint64(32)) & np.uint64(0xFFFF)) | (((off >> np.uint64(32)) & np.uint64(0xFFFF)) << np.uint64(16)),
                    np.full(n, off & MASK)], axis=1)
    key = np.tile(np.array([[seed & U32, seed >> 32]], dtype=np.uint64), (n, 1))
    return np_philox4x32(ctr, key)


def np_uniform(words, p):
    """The (2k + 1) / 2**p grid of philox.h from a block's words."""
    if p <= 24:
        k = words[:, 0] >> np.uint64(33 - p)
    else:
        k = (words[:, 0] | (words[:, 1] << np.uint64(32))) >> np.uint64(65 - p)
    return (2 * k + 1).astype(np.float64) * 2.0 ** -p


def np_normal(words):
    u1 = np_uniform(words[:, 0:2], 53)
    u2 = np_uniform(words[:, 2:4], 53)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@pytest.mark.parametrize("rounds", [1, 2, 7, 10, 13, 16])
def test_block_matches_numpy_reference(rounds):
    g = torch.Generator().manual_seed(rounds)
    ctr = torch.randint(0, 2 ** 32, (2000, 4), generator=g)
    key = torch.randint(0, 2 ** 32, (2000, 2), generator=g)
    # edge words
    ctr[:4] = torch.tensor([[0, 0, 0, 0], [U32] * 4, [U32, 0, U32, 0], [0, U32, 0, U32]])
    key[:4] = torch.tensor([[0, 0], [U32, U32], [0, U32], [U32, 0]])
    out = lib.philox4x32(ctr, key, rounds).numpy()
    np.testing.assert_array_equal(out.astype(np.uint64), np_philox4x32(ctr.numpy(), key.numpy(), rounds))


def test_block_noncontiguous_and_empty():
    ctr = torch.randint(0, 2 ** 32, (8, 4)).t().contiguous().t()  # column-major (8, 4)
    key = torch.randint(0, 2 ** 32, (8, 2))
    assert not ctr.is_contiguous()
    np.testing.assert_array_equal(lib.philox4x32(ctr, key).numpy(), lib.philox4x32(ctr.contiguous(), key).numpy())
    assert lib.philox4x32(torch.zeros(0, 4, dtype=torch.long), torch.zeros(0, 2, dtype=torch.long)).shape == (0, 4)


@pytest.mark.parametrize("seed,offset", [(0, 0), (12345, 7), (2 ** 63 - 1, 2 ** 40 + 3), (2 ** 62 + 1, MAX_OFFSET - 1),
                                         (2 ** 63 - 2 ** 32, 2 ** 32)])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_uniform_matches_numpy_reference(seed, offset, dtype):
    n = 1000
    out = lib.philox_uniform([n], seed=seed, offset=offset, dtype=dtype, device="cpu")
    ref = np_uniform(np_stream_block0(seed, offset, n), SIGNIFICAND_BITS[dtype])
    # the grid values are exact in the output dtype: bitwise equality
    np.testing.assert_array_equal(out.double().numpy(), ref)


@pytest.mark.parametrize("seed,offset", [(0, 0), (987654321, 3), (2 ** 63 - 5, 2 ** 47)])
def test_normal_matches_numpy_reference(seed, offset):
    n = 1000
    ref = np_normal(np_stream_block0(seed, offset, n))
    out64 = lib.philox_normal([n], seed=seed, offset=offset, dtype=torch.float64, device="cpu").numpy()
    np.testing.assert_allclose(out64, ref, rtol=1e-12, atol=1e-13)
    out32 = lib.philox_normal([n], seed=seed, offset=offset, dtype=torch.float32, device="cpu")
    # float32 = the float64 value rounded once
    np.testing.assert_array_equal(out32.numpy(), torch.from_numpy(out64).float().numpy())


def test_shape_is_row_major_index():
    flat = lib.philox_uniform([24], seed=3, offset=1, dtype=torch.float64, device="cpu")
    shaped = lib.philox_uniform([2, 3, 4], seed=3, offset=1, dtype=torch.float64, device="cpu")
    assert shaped.shape == (2, 3, 4)
    assert torch.equal(shaped.reshape(-1), flat)
    assert lib.philox_normal([], seed=3, offset=1, dtype=torch.float32, device="cpu").shape == ()
    assert lib.philox_normal([0, 5], seed=3, offset=1, dtype=torch.float32, device="cpu").shape == (0, 5)


# ----------------------------------------------------------------------------
# (c) statistics (fixed seeds; 5 standard errors, or p > 1e-3)
N = 1 << 18
Z = 5.0


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_uniform_open_interval_and_grid(dtype):
    u = lib.philox_uniform([N], seed=11, offset=0, dtype=dtype, device="cpu")
    assert u.dtype == dtype
    p = SIGNIFICAND_BITS[dtype]
    ud = u.double()
    assert ud.min().item() >= 2.0 ** -p and ud.max().item() <= 1 - 2.0 ** -p
    k2 = ud * 2.0 ** p  # odd integers
    assert torch.equal(k2, k2.round()) and bool(((k2.long() % 2) == 1).all())


def test_uniform_goodness_of_fit():
    u = lib.philox_uniform([N], seed=2024, offset=0, dtype=torch.float64, device="cpu").numpy()
    assert abs(u.mean() - 0.5) < Z * math.sqrt(1 / 12 / N)
    assert abs(u.var() - 1 / 12) < Z * math.sqrt((1 / 80 - 1 / 144) / N)
    assert stats.kstest(u, "uniform").pvalue > 1e-3
    u32 = lib.philox_uniform([N], seed=2025, offset=0, dtype=torch.float32, device="cpu").numpy()
    assert stats.kstest(u32.astype(np.float64), "uniform").pvalue > 1e-3
    counts = np.bincount((u32 * 256).astype(np.int64), minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-3


def test_uniform_independence_across_index_offset_seed():
    a = lib.philox_uniform([N], seed=1, offset=0, dtype=torch.float64, device="cpu").numpy()
    b = lib.philox_uniform([N], seed=1, offset=1, dtype=torch.float64, device="cpu").numpy()
    c = lib.philox_uniform([N], seed=2, offset=0, dtype=torch.float64, device="cpu").numpy()
    tol = Z / math.sqrt(N)
    for x, y in ((a[:-1], a[1:]), (a, b), (a, c)):
        assert abs(np.corrcoef(x, y)[0, 1]) < tol
    # pairs of neighbours fill the unit square evenly (16 x 16 cells)
    cells = (a[0::2] * 16).astype(int) * 16 + (a[1::2] * 16).astype(int)
    assert stats.chisquare(np.bincount(cells, minlength=256)).pvalue > 1e-3


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_normal_moments_and_fit(dtype):
    z = lib.philox_normal([N], seed=777, offset=0, dtype=dtype, device="cpu").double().numpy()
    assert abs(z.mean()) < Z / math.sqrt(N)
    assert abs(z.var() - 1) < Z * math.sqrt(2 / N)
    assert abs(stats.skew(z)) < Z * math.sqrt(6 / N)
    assert abs(stats.kurtosis(z)) < Z * math.sqrt(24 / N)
    assert stats.kstest(z, "norm").pvalue > 1e-3
    assert np.isfinite(z).all() and np.abs(z).max() <= math.sqrt(-2 * math.log(2.0 ** -53)) + 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_normal_low_precision(dtype):
    z = lib.philox_normal([N], seed=5, offset=0, dtype=dtype, device="cpu")
    assert z.dtype == dtype and bool(torch.isfinite(z).all())
    ref = lib.philox_normal([N], seed=5, offset=0, dtype=torch.float64, device="cpu")
    # one rounding (via float32: at most 2**-P relative more); float16 subnormals below 2**-14
    assert torch.allclose(z.double(), ref, rtol=2.0 ** -(SIGNIFICAND_BITS[dtype] - 1), atol=2.0 ** -24)


# ----------------------------------------------------------------------------
# (d) determinism
@pytest.mark.parametrize("op", [lib.philox_uniform, lib.philox_normal])
def test_same_result_for_any_thread_count(op):
    n = 100_003  # several grains, ragged end
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op([n], seed=42, offset=9, dtype=torch.float32, device="cpu")
        torch.set_num_threads(2)
        two = op([n], seed=42, offset=9, dtype=torch.float32, device="cpu")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    assert torch.equal(one, op([n], seed=42, offset=9, dtype=torch.float32, device="cpu"))


def test_offsets_and_seeds_differ():
    base = lib.philox_uniform([1000], seed=42, offset=0, dtype=torch.float64, device="cpu")
    for seed, offset in ((42, 1), (42, 2 ** 32), (42, 2 ** 47), (43, 0), (42 + 2 ** 32, 0)):
        other = lib.philox_uniform([1000], seed=seed, offset=offset, dtype=torch.float64, device="cpu")
        assert (other == base).sum().item() == 0  # 2**-52 chance per element of a tie


# ----------------------------------------------------------------------------
# (e) torch.Generator semantics
@pytest.mark.parametrize("fn", [philox_uniform, philox_normal])
def test_manual_seed_is_respected(fn):
    torch.manual_seed(0)
    a1, a2 = fn((3, 5)), fn((3, 5))
    torch.manual_seed(0)
    b1, b2 = fn((3, 5)), fn((3, 5))
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)  # successive calls give fresh samples
    torch.manual_seed(1)
    assert not torch.equal(fn((3, 5)), a1)


def test_explicit_generator():
    state = torch.get_rng_state()
    a = philox_normal(100, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    b = philox_normal(100, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert torch.equal(a, b)
    assert torch.equal(torch.get_rng_state(), state)  # the default generator was not touched


def test_seed_drawn_from_the_cpu_generator():
    """Without a seed the op draws it inside, from the CPU generator: equal generator
    states give equal numbers, the generator advances, and the default generator is the
    one torch.manual_seed seeds."""
    g = torch.Generator().manual_seed(3)
    a = philox_uniform(1000, generator=g, dtype=torch.float64)
    g_ref = torch.Generator().manual_seed(3)
    b = philox_uniform(1000, generator=g_ref, dtype=torch.float64)
    assert torch.equal(a, b)
    assert not torch.equal(philox_uniform(1000, generator=g, dtype=torch.float64), a)  # g advanced
    torch.manual_seed(3)
    assert torch.equal(philox_uniform(1000, dtype=torch.float64), a)  # the default generator: same state


def test_wrapper_defaults_and_dtypes():
    assert philox_uniform(4).dtype == torch.get_default_dtype()
    assert philox_uniform([2, 2], dtype=torch.bfloat16).dtype == torch.bfloat16
    assert philox_normal(torch.Size([2, 3])).shape == (2, 3)
    assert philox_normal(3, device="meta").device.type == "meta"


# ----------------------------------------------------------------------------
# (f) opcheck (schema, fake tensors, autograd registration, AOT dispatch);
# the factory ops have no tensor inputs but opcheck handles them all the same.
def test_opcheck_philox4x32():
    ctr = torch.randint(0, 2 ** 32, (7, 4))
    key = torch.randint(0, 2 ** 32, (7, 2))
    torch.library.opcheck(lib.philox4x32, (ctr, key, 10))
    torch.library.opcheck(lib.philox4x32, (ctr, key), {"rounds": 7})


@pytest.mark.parametrize("op", [lib.philox_uniform, lib.philox_normal])
@pytest.mark.parametrize("size,dtype", [([3, 4], torch.float32), ([5], torch.float64), ([0], torch.float16)])
def test_opcheck_factory_ops(op, size, dtype):
    torch.library.opcheck(op, (size,), {"dtype": dtype, "device": torch.device("cpu"), "seed": 123, "offset": 4})


def test_meta_device():
    out = lib.philox_uniform([2, 3], seed=1, offset=0, dtype=torch.float32, device="meta")
    assert out.device.type == "meta" and out.shape == (2, 3) and out.dtype == torch.float32


# ----------------------------------------------------------------------------
# (g) bad input
def _i64(*shape):
    return torch.zeros(shape, dtype=torch.int64)


@pytest.mark.parametrize("args,msg", [
    ((_i64(3, 4).int(), _i64(3, 2), 10), "counter must have dtype int64"),
    ((_i64(3, 4), _i64(3, 2).double(), 10), "key must have dtype int64"),
    ((_i64(3, 3), _i64(3, 2), 10), r"counter must have shape \(n, 4\)"),
    ((_i64(12), _i64(3, 2), 10), r"counter must have shape \(n, 4\)"),
    ((_i64(3, 4), _i64(3, 1), 10), r"key must have shape \(n, 2\)"),
    ((_i64(3, 4), _i64(2, 2), 10), "same number of rows"),
    ((_i64(3, 4), _i64(3, 2), 0), r"rounds must be in \[1, 16\]"),
    ((_i64(3, 4), _i64(3, 2), 17), r"rounds must be in \[1, 16\]"),
    ((_i64(3, 4) - 1, _i64(3, 2), 10), "counter must hold uint32 values"),
    ((_i64(3, 4), _i64(3, 2) + 2 ** 32, 10), "key must hold uint32 values"),
])
def test_philox4x32_bad_input(args, msg):
    with pytest.raises(RuntimeError, match=msg):
        lib.philox4x32(*args)


@pytest.mark.parametrize("op", [lib.philox_uniform, lib.philox_normal])
@pytest.mark.parametrize("size,offset,dtype,msg", [
    ([3], -1, torch.float32, r"offset must be in \[0, 2\^48 - 1\]"),
    ([3], 2 ** 48, torch.float32, r"offset must be in \[0, 2\^48 - 1\]"),
    ([3], 2 ** 63 - 1, torch.float32, r"offset must be in \[0, 2\^48 - 1\]"),
    ([3], 0, torch.int64, "dtype must be float16, bfloat16, float32 or float64"),
    ([3], 0, torch.complex64, "dtype must be float16, bfloat16, float32 or float64"),
    ([2, -1], 0, torch.float32, "size must be non-negative"),
    ([2 ** 24, 2 ** 24], 0, torch.float32, "fewer than 2\\^48 elements"),
])
def test_factory_bad_input(op, size, offset, dtype, msg):
    with pytest.raises(RuntimeError, match=msg):
        op(size, dtype=dtype, device="cpu", seed=0, offset=offset)


@pytest.mark.parametrize("op", [lib.philox_uniform, lib.philox_normal])
def test_factory_bad_seed_arguments(op):
    with pytest.raises(RuntimeError, match=r"seed must be in \[0, 2\^63\)"):
        op([3], dtype=torch.float32, device="cpu", seed=-1)
    with pytest.raises(RuntimeError, match="offset needs an explicit seed"):
        op([3], dtype=torch.float32, device="cpu", offset=1)
    with pytest.raises(RuntimeError, match="either generator or seed"):
        op([3], dtype=torch.float32, device="cpu", generator=torch.Generator(), seed=1)


def test_wrapper_bad_input():
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        philox_uniform(3, generator=0)
    with pytest.raises(TypeError, match="size must be an int or a sequence of ints"):
        philox_uniform(2.5)
    with pytest.raises(ValueError, match="size must be non-negative"):
        philox_normal((2, -3))
    with pytest.raises(TypeError, match="dtype must be"):
        philox_normal(3, dtype=torch.int32)
    # integers >= 2**63 are refused here with a message, not by the dispatcher's type check
    with pytest.raises(ValueError, match="fewer than 2\\*\\*48 elements"):
        philox_uniform(2 ** 63)
    with pytest.raises(ValueError, match=r"philox_uniform: seed must be in \[0, 9223372036854775808\), got 9223372036854775808"):
        philox_uniform(3, seed=2 ** 63)
    with pytest.raises(ValueError, match=r"philox_normal: offset must be in \[0, 281474976710656\)"):
        philox_normal(3, seed=1, offset=2 ** 63 - 1)
    with pytest.raises(ValueError, match="offset needs an explicit seed"):
        philox_normal(3, offset=1)
    with pytest.raises(ValueError, match="either generator or seed"):
        philox_normal(3, seed=1, generator=torch.Generator())
    with pytest.raises(TypeError, match="seed must be an int"):
        philox_normal(3, seed=1.5)
    assert torch.equal(philox_normal(5, seed=7, offset=3, dtype=torch.float64),
                       lib.philox_normal([5], dtype=torch.float64, device="cpu", seed=7, offset=3))


# ----------------------------------------------------------------------------
# CUDA: the same numbers as the CPU
@needs_cuda
def test_cuda_matches_cpu():
    ctr = torch.randint(0, 2 ** 32, (5000, 4))
    key = torch.randint(0, 2 ** 32, (5000, 2))
    assert torch.equal(lib.philox4x32(ctr.cuda(), key.cuda(), 10).cpu(), lib.philox4x32(ctr, key, 10))
    for dtype in FLOAT_DTYPES:
        u_cpu = lib.philox_uniform([3, 50_000], seed=99, offset=5, dtype=dtype, device="cpu")
        u_gpu = lib.philox_uniform([3, 50_000], seed=99, offset=5, dtype=dtype, device="cuda")
        assert u_gpu.device.type == "cuda" and torch.equal(u_gpu.cpu(), u_cpu)
    z_cpu = lib.philox_normal([100_000], seed=99, offset=5, dtype=torch.float64, device="cpu")
    z_gpu = lib.philox_normal([100_000], seed=99, offset=5, dtype=torch.float64, device="cuda")
    torch.testing.assert_close(z_gpu.cpu(), z_cpu, rtol=1e-13, atol=1e-14)
    # the default CUDA generator: torch.manual_seed makes it reproducible, calls differ
    torch.manual_seed(0)
    a = philox_uniform(1000, device="cuda", dtype=torch.float64)
    b = philox_uniform(1000, device="cuda", dtype=torch.float64)
    torch.manual_seed(0)
    assert torch.equal(a, philox_uniform(1000, device="cuda", dtype=torch.float64))
    assert not torch.equal(a, b)


# ----------------------------------------------------------------------------
# PhiloxStream (multi-draw streams for later samplers): philox.h needs nothing
# but <cmath>/<cstdint>, so a tiny driver is compiled with the host compiler.


@pytest.fixture(scope="module")
def stream_driver(tmp_path_factory):
    return compile_driver(tmp_path_factory, "philox_stream_check", "-O1")


def np_stream_words(seed, offset, index, nblocks):
    seed %= 2 ** 64
    ctr = np.array([[j, index & U32, ((index >> 32) & 0xFFFF) | (((offset >> 32) & 0xFFFF) << 16), offset & U32]
                    for j in range(nblocks)], dtype=np.uint64)
    key = np.tile(np.array([[seed & U32, seed >> 32]], dtype=np.uint64), (nblocks, 1))
    return [int(w) for w in np_philox4x32(ctr, key).reshape(-1)]


def _u(bits, p):
    return np_uniform(np.array([[bits & U32, bits >> 32]], dtype=np.uint64), p)[0]


def _bm(w):  # Box-Muller pair from four words
    u1, u2 = _u(w[0] | w[1] << 32, 53), _u(w[2] | w[3] << 32, 53)
    r = math.sqrt(-2 * math.log(u1))
    return r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)


@pytest.mark.parametrize("seed,offset,index", [(0, 0, 0), (2 ** 64 - 1, 2 ** 48 - 1, 2 ** 48 - 1),
                                               (123456789, 5, 2 ** 33 + 17)])
def test_stream_draw_sequence(stream_driver, seed, offset, index):
    out = subprocess.run([stream_driver, str(seed), str(offset), str(index)], check=True, capture_output=True,
                         text=True).stdout.split("\n")
    got = [line.split() for line in out if line]
    w = np_stream_words(seed, offset, index, 5)
    # 1. raw words cross block boundaries in order
    assert [int(v) for k, v in got[:14]] == w[:14]
    assert got[14] == ["used", "14"]
    # 2. mixed draws, word by word (a normal pair takes four words, unaligned here)
    rest = got[15:]
    z0, z1 = _bm(w[6:10])
    z2, _ = _bm(w[10:14])
    z3, _ = _bm(w[15:19])
    expected = [("u32", w[0]), ("u64", w[1] | w[2] << 32), ("f24", _u(w[3], 24)), ("f53", _u(w[4] | w[5] << 32, 53)),
                ("n", z0),          # a new pair from words 6..9
                ("n", z1),          # its second variate, from the cache
                ("n", z2),          # a new pair (words 10..13)
                ("u32", w[14]),     # a raw draw drops the cached variate
                ("n", z3),          # so this is a new pair (words 15..18)
                ("f11", _u(w[19], 11)), ("used", 20)]
    assert [k for k, _ in rest] == [k for k, _ in expected]
    for (k, v), (_, e) in zip(rest, expected):
        if k in ("u32", "u64", "used"):
            assert int(v) == e, k
        elif k in ("f24", "f53", "f11"):
            assert float(v) == e, k
        else:
            assert float(v) == pytest.approx(e, rel=1e-13, abs=1e-14), k
