"""Where the tests find the project's shared data (../shared/data beside the checkout, or
$VMFDIST_SHARED_DATA): the library itself never looks there, so every test that uses the
data passes its path explicitly, and skips (saying why) on a machine without it."""
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("VMFDIST_SHARED_DATA", ROOT.parent / "shared" / "data"))
UCI_DIR = SHARED_DATA / "uci"

needs_uci = pytest.mark.skipif(not UCI_DIR.is_dir(), reason=f"the UCI data are not at {UCI_DIR} (../shared/data/uci "
                               "beside this checkout, or set VMFDIST_SHARED_DATA)")
