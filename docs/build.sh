#!/usr/bin/env bash
# Build the HTML documentation into docs/_build/html, warnings as errors.
# Usage: docs/build.sh [extra sphinx-build options]   (SPHINXBUILD=... to pick a sphinx-build)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# SPHINXBUILD may be a command with arguments ("python -m sphinx"): left unquoted on purpose
exec ${SPHINXBUILD:-sphinx-build} -b html -W --keep-going -n "$here" "$here/_build/html" "$@"
