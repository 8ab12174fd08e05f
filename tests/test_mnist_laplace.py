"""mnist-laplace: the rotation against exact pixel permutations, and a smoke run of the command
on MNIST-format files the test writes (with --resume)."""
import json

import numpy as np
import pytest
import torch

from vmfdist.experiments import __main__ as cli
from vmfdist.experiments import mnist_laplace

from .test_datasets import write_mnist


def test_rotate_is_exact_on_quarter_turns():
    """With an even image size, quarter turns about the centre map pixel centres onto pixel
    centres, so bilinear interpolation must reproduce torch.rot90 / flips exactly."""
    x = torch.rand(3, 1, 28, 28, dtype=torch.float64)
    torch.testing.assert_close(mnist_laplace.rotate(x, 90), torch.rot90(x, 1, dims=(2, 3)), rtol=0, atol=1e-12)
    torch.testing.assert_close(mnist_laplace.rotate(x, 180), torch.flip(x, dims=(2, 3)), rtol=0, atol=1e-12)
    torch.testing.assert_close(mnist_laplace.rotate(x, 0), x, rtol=0, atol=1e-12)
    # a small angle keeps the image's centre pixel block and moves the rest
    y = mnist_laplace.rotate(x, 15)
    assert not torch.allclose(y, x)


def _class_images(folder, n_train=240, n_test=60):
    """MNIST-format files whose images are a bright square at a class-dependent place."""
    arrays = write_mnist(folder, n_train=n_train, n_test=n_test)
    for key in ("train", "t10k"):
        labels = arrays[f"{key}-labels-idx1-ubyte"]
        images = np.zeros((len(labels), 28, 28), np.uint8)
        for i, c in enumerate(labels):
            r, q = divmod(int(c), 5)
            images[i, 4 + 10 * r:10 + 10 * r, 2 + 5 * q:6 + 5 * q] = 255
        arrays[f"{key}-images-idx3-ubyte"] = images
    from .test_datasets import write_idx
    import gzip
    import os
    for stem, a in arrays.items():
        write_idx(os.path.join(folder, stem + ".gz"), a, compress=True)
    assert gzip  # the writer compresses
    return arrays


def test_smoke_run_and_resume(tmp_path):
    data = tmp_path / "mnist"
    _class_images(data)
    out = tmp_path / "out"
    base = ["mnist-laplace", "--data-dir", str(data), "--limit", "160", "--test-limit", "40", "--validation", "30",
            "--shift-images", "8", "--epochs", "2", "--no-laplace-torch", "--out", str(out)]
    cli.main(base + ["--seeds", "1"])
    r = json.loads((out / "mnist_laplace.json").read_text())
    assert len(r["seeds"]) == 1 and r["partial"] is False
    s = r["seeds"][0]
    for key in mnist_laplace.METHODS:
        m = s[key]
        assert 0 <= m["accuracy"] <= 1 and m["nll"] > 0 and 0 <= m["ece"] <= 1 and 0 <= m["ood_auroc"] <= 1
        assert sorted(int(a) for a in m["rotated"]) == mnist_laplace.ANGLES
    # the marginal-likelihood and validation priors are chosen by different rules
    assert s["kfac"]["prior_precision"] > 0 and s["kfac-marglik"]["prior_precision"] > 0
    assert s["map"]["accuracy"] > 0.5  # the squares are easy; two epochs of 130 images separate most
    # GLM probit and MC of the same Laplace agree in accuracy to a few images
    assert abs(s["kfac"]["accuracy"] - s["kfac-mc"]["accuracy"]) <= 2 / 40
    # --resume with a second seed keeps seed 0 as it is and runs seed 1 only
    cli.main(base + ["--seeds", "2", "--resume"])
    r2 = json.loads((out / "mnist_laplace.json").read_text())
    assert [t["seed"] for t in r2["seeds"]] == [0, 1]
    assert r2["seeds"][0] == s
    with pytest.raises(SystemExit):  # other settings: refused by name
        cli.main(base + ["--seeds", "2", "--resume", "--shift-images", "10"])
    assert (out / "mnist_laplace.md").read_text().count("| K-FAC Laplace") == 3 * 2  # main and rotation tables


def test_bad_options_are_named(tmp_path, capsys):
    for argv, word in ((["mnist-laplace"], "--data-dir is required"),
                       (["mnist-laplace", "--data-dir", str(tmp_path)], "no MNIST-format data"),
                       (["mnist-laplace", "--data-dir", str(tmp_path), "--seeds", "0"], "--seeds")):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert word in capsys.readouterr().err


def test_download_option_fetches_into_the_cache(tmp_path, monkeypatch):
    """--download without --data-dir: the files come from the (here: local) mirror, are checked
    against SHA-256 sums computed here with hashlib, and land in $VMFDIST_DATA/MNIST."""
    import argparse
    import gzip
    import hashlib

    from vmfdist.datasets import download
    from vmfdist.experiments import mnist_data

    mirror = tmp_path / "mirror"
    _class_images(mirror, n_train=30, n_test=10)
    files = {stem: {"sha256": hashlib.sha256(gzip.decompress((mirror / f"{stem}.gz").read_bytes())).hexdigest()}
             for stem in download.MNIST_STEMS}
    monkeypatch.setitem(download.MNIST_SOURCES, "MNIST", {"mirrors": (mirror.as_uri() + "/",), "files": files})
    monkeypatch.setenv("VMFDIST_DATA", str(tmp_path / "cache"))
    p = argparse.ArgumentParser()
    mnist_data.add_data_arguments(p)
    xtr, ytr, xte, yte = mnist_data.load(p.parse_args(["--download"]))
    assert xtr.shape == (30, 1, 28, 28) and xte.shape == (10, 1, 28, 28)
    assert sorted(f.name for f in (tmp_path / "cache" / "MNIST").iterdir()) == sorted(f"{s}.gz" for s in files)
    with pytest.raises(ValueError, match="--download"):
        mnist_data.load(p.parse_args([]))
