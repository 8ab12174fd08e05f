#!/usr/bin/env bash
# The wheels the GPU machine lacks, for its Python 3.12, into gpu_wheels/ (git-ignored), so that
# the device tool can carry them (carry ["gpu_wheels"]; at most 64 MiB travel with the tree).
#
#   bash scripts/gpu_wheels.sh           # download (needs the package index), then --check
#   bash scripts/gpu_wheels.sh --check   # offline: is the set complete and small enough?
#
# What is carried: the benchmark peers (TFP for its JAX substrate, with dm-tree and gast;
# power_spherical; bayesian-torch) and the reference peers some test modules import
# (laplace-torch and what its import needs: benchmarks/requirements-kron.txt).  Everything else
# is in the machine's image (scripts/gpu_image_packages.txt).  --check reads each wheel's
# Requires-Dist (markers evaluated for CPython 3.12 on Linux, extras ignored) and fails on a
# requirement that is neither carried nor in the image, on two versions of one package, and on a
# set over 40 MiB (the rest of the 64 MiB is the working tree's).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$ROOT/gpu_wheels"
PY="${PYTHON:-python3}"
# pinned: the versions benchmarks/requirements*.txt name (those the CPU runs use)
PEERS="tensorflow-probability==0.25.0 dm-tree==0.1.10 gast==0.7.0 decorator==5.2.1 power_spherical==0.8.1
bayesian-torch==0.5.0 laplace-torch==0.3 asdfghjkl==0.1a5 backpack-for-pytorch==1.7.1
curvlinops-for-pytorch==3.0.1 unfoldnd==0.2.3 einconv==0.1.0"
if [ "${1:-}" != "--check" ]; then
  mkdir -p "$DIR"
  for p in $PEERS; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --abi cp312 --abi abi3 --abi none \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$DIR" "$p"
  done
fi
"$PY" - "$DIR" "$ROOT/scripts/gpu_image_packages.txt" <<'PYEOF'
import email.parser, os, re, sys, zipfile

wdir, image_list = sys.argv[1], sys.argv[2]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
image = {norm(l.strip()) for l in open(image_list) if l.strip() and not l.startswith("#")}
wheels = sorted(f for f in os.listdir(wdir) if f.endswith(".whl")) if os.path.isdir(wdir) else []
if not wheels:
    sys.exit(f"no wheels in {wdir}: run bash scripts/gpu_wheels.sh (needs the package index)")
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "extra": ""}
try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.requirements import Requirement
carried, needs, problems, size = {}, [], [], 0
for w in wheels:
    size += os.path.getsize(os.path.join(wdir, w))
    name = norm(w.split("-")[0])
    if name in carried:
        problems.append(f"two wheels of {name}: {carried[name]} and {w}")
    carried[name] = w
    with zipfile.ZipFile(os.path.join(wdir, w)) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode())
    tags = w[:-4].split("-")[-3:]
    if not (tags[0] in ("py3", "py2.py3", "cp312") or tags[0].startswith("py3")) and tags[1] != "abi3":
        problems.append(f"{w}: not for CPython 3.12 ({'-'.join(tags)})")
    for r in msg.get_all("Requires-Dist") or []:
        req = Requirement(r)
        if req.marker is None or req.marker.evaluate(env):
            needs.append((w, norm(req.name)))
for w, n in needs:
    if n not in carried and n not in image:
        problems.append(f"{w} needs {n}: neither carried nor in the GPU image")
limit = 40 * 2 ** 20
if size > limit:
    problems.append(f"the wheels take {size / 2**20:.1f} MiB, over {limit / 2**20:.0f} MiB")
print(f"{len(wheels)} wheels, {size / 2**20:.1f} MiB in {wdir}; {len(needs)} requirements checked against the "
      f"carried set and the image's {len(image)} packages")
for p in problems:
    print("PROBLEM:", p)
sys.exit(1 if problems else 0)
PYEOF
