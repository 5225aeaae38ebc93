"""Makes this folder's release with the toolkit as it was before issue 37 (commit d5a4b09), which wrote
promotion/v2 records (each promote overwrote the last) and enrolled-hosts/v1 files (no chain). Not run by the
tests: they read what it made, as a release folder of that time is read today.

    git archive d5a4b09 | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old:/tmp/old/tests python tests/data/legacy-release/make.py tests/data/legacy-release

The old test helpers' Lab: a release of sm120 (the old helpers' statement, an image digest no registry serves)
made by the real release steps of that toolkit, one GPU host enrolled, two promotes of evidence records made and
signed as its start.sh made and signed them (the GPU is a stand-in: no GPU on the build host).
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

out = Path(sys.argv[1]).resolve()
work = Path(tempfile.mkdtemp(prefix="legacy-release-"))
os.environ["QUALIFY_TRUST_DIR"] = str(work / "trust")

from evidence_helpers import Lab  # noqa: E402  (the old toolkit's, from PYTHONPATH)

lab = Lab(work / "lab")
lab.run([lab.record(1)])
lab.run([lab.record(i) for i in range(2, 4)])
for name in ("manifests", "keys"):
    shutil.rmtree(out / name, ignore_errors=True)
shutil.copytree(lab.manifests, out / "manifests")
shutil.copytree(lab.root / "keys", out / "keys")
shutil.rmtree(work)
print(f"{out}: {sorted(p.name for p in (out / 'manifests' / 'v1.0.0').iterdir())}")
