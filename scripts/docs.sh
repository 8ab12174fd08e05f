#!/usr/bin/env bash
# Build the HTML documentation into docs/_build/html with Sphinx, warnings as errors (-W -n).
#
# The docs environment ($DOCS_VENV, default .venv-docs) holds only Sphinx and its extensions.
# torch, numpy and mpmath come from the project's environment ($VENV, default .venv): the docs
# venv is made by that venv's interpreter and a .pth file appends its site-packages to sys.path,
# so pip sees torch as installed and never downloads a second one (about 2.5 GB), and the two
# environments cannot drift to different torch versions.  Sphinx's packages stay out of $VENV.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
DOCS_VENV=${DOCS_VENV:-.venv-docs}
if [ ! -x "$VENV/bin/python" ]; then
  echo "scripts/docs.sh: $VENV/bin/python not found; run 'make setup' (or set VENV)" >&2
  exit 1
fi
if [ ! -x "$DOCS_VENV/bin/python" ]; then
  "$VENV/bin/python" -m venv "$DOCS_VENV"
fi
PY="$DOCS_VENV/bin/python"
site_docs=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
site_main=$(cd "$VENV" && "$(pwd)/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site_main" > "$site_docs/vmfdist-project-venv.pth"
stamp="$DOCS_VENV/.requirements-installed"
if [ ! -f "$stamp" ] || [ docs/requirements.txt -nt "$stamp" ]; then
  "$PY" -m pip install -q -r docs/requirements.txt
  touch "$stamp"
fi
"$PY" -c 'import sys, torch; sys.exit(f"a second torch is in {sys.argv[1]}" if torch.__file__.startswith(sys.argv[1]) else 0)' "$site_docs"
SPHINXBUILD="$DOCS_VENV/bin/sphinx-build" exec bash docs/build.sh "$@"
