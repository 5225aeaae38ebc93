"""Attention, MoE and quantized-linear providers a serving engine would select for a target.

`predict()` applies vLLM 0.33.0's own priority rules (or SGLang 0.5.23's, for an image with SGLang installed:
`engines_in`) to the target capability and then asks the census whether each provider's kernels can really
run there; `observe()` asks vLLM itself when a GPU is present. The package, one module per idea:

    rules.py        the rule data (qualify/probe/rules/vllm-0.33.json, sglang-0.5.23.json), loaded and
                    validated once; which engines an image has
    census_view.py  the census as typed records (CensusRecord), keyed by library path
    image.py        what the image offers a provider: libraries judged, JIT sources, files
    selection.py    vLLM's gate and the candidate that can really run: predict()
    families.py     a provider's kernel families on the target, from the libraries' kernel names
    paths.py        the manifest's serving paths: vLLM's pick, its families, the fallback, a verdict
    checks.py       providers.<kind>.<variant>: one check per serving path
    observe.py      vLLM's own selectors in a child interpreter, merged over the prediction
    entry.py        ProviderEntry and Candidate, what all of them hand on

How the tables were confirmed: read from the vLLM 0.33.0 wheel's sources, then
executed: the snippet's `--assume-capability` mode ran vLLM 0.33.0's own
selector functions (torch 2.14.0, flashinfer-python 0.7.2.post1) for 9.0, 10.0,
10.3, 12.0, 12.1 and 13.0 on a CPU host, and vLLM's choices matched
`vllm_would_select` here (tests/test_providers.py keeps that matrix). Not
executable that way: MLA on 10.x (a backend module needs a driver at import),
model-dependent constraints (head sizes, routing methods, group sizes), and
what happens inside a kernel launch. Reasons say where a rule is unconfirmed.
SGLang's tables were read from the sglang 0.5.23 wheel's sources (its files are named in each table); SGLang
cannot be imported without torch and a CUDA device, so five of its selector functions were run one by one on
a CPU host, taken out of the wheel's source (tests/sglang_source.py), and agree with the tables
(`selections` in rules/sglang-0.5.23.json; tests/test_sglang_wheel_paths.py runs them again).

Standard library only, Python 3.9 compatible (runs inside images).
"""

from __future__ import annotations

from qualify.probe.providers.census_view import CensusRecord, census_entry, census_index, index_rows
from qualify.probe.providers.checks import CHECK_TITLES, NOT_INSTALLED, provider_checks
from qualify.probe.providers.entry import Candidate, Mode, ProviderEntry
from qualify.probe.providers.families import cached as cached_names
from qualify.probe.providers.observe import merge, observation_failure, observe, observed_name, observed_providers
from qualify.probe.providers.paths import serving_paths
from qualify.probe.providers.rules import PROVIDER_KINDS, Rules, RulesError, Table, default, engines_in, for_engine
from qualify.probe.providers.selection import predict

RULES = default()
TABLES = RULES.tables
VLLM_TARGET = RULES.vllm
VLLM_0_33_SELECTIONS = RULES.selections  # what vLLM 0.33.0 itself chose, per capability

__all__ = [
    "CHECK_TITLES", "PROVIDER_KINDS", "NOT_INSTALLED", "RULES", "TABLES", "VLLM_0_33_SELECTIONS", "VLLM_TARGET",
    "Candidate", "CensusRecord", "Mode", "ProviderEntry", "Rules", "RulesError", "Table",
    "cached_names", "census_entry", "census_index", "engines_in", "for_engine", "index_rows", "merge",
    "observation_failure", "observe",
    "observed_name", "observed_providers", "predict", "provider_checks", "serving_paths",
]
