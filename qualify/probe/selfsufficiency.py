"""Runtime self-sufficiency: what a vLLM image would download or compile at run time.

An air-gapped deployment gets neither, so each is a finding:

- runtime.flashinfer-cubin: FlashInfer's trtllm-gen cubins come from the
  flashinfer-cubin wheel only when its version equals flashinfer-python's
  exactly (flashinfer/jit/env.py `_check_cubin_version`); otherwise FlashInfer
  ignores the wheel and downloads them at first use. vLLM 0.33.0 requires
  flashinfer-python==0.7.2.post1 (its METADATA) and not flashinfer-cubin, whose
  newest release on PyPI is 0.6.13: no wheel matches. Where the target's
  providers run those cubins (10.x: trtllm-gen attention, MLA and MoE;
  probe/cubinusers.py) the image is not self-sufficient, a failure (issue 51,
  flashinfer-ai/flashinfer#2941); where none does (12.x), nothing is fetched.
- runtime.jit-nvcc: FlashInfer (without a matching flashinfer-jit-cache),
  DeepGEMM (bundled in vLLM 0.33.0 as vllm/third_party/deep_gemm) and TileLang
  compile kernels with nvcc at first use; without an nvcc that targets the GPU
  they fail there, not at start-up.
- runtime.downloads: everything that fetches at run time, each a failure: an
  image that downloads at first use is not air-gap self-sufficient, and a
  warning beside a pass would let it ship as one.

Facts are from the vLLM 0.33.0 and flashinfer-python 0.7.2.post1 wheels (file
names in the reasons) and from running them; see each reason.

Reads files and dist-info (importlib.metadata) and runs nvcc with `--version`,
`--list-gpu-code` and `--dryrun` (which compiles nothing); imports nothing else. Standard library only, Python 3.9
compatible (runs inside images).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from qualify.core.arch import ArchError, Capability, CodeKind, CodeTarget
from qualify.probe.model import FAIL, PASS, WARN, CheckResult

FI, FI_CUBIN, FI_JIT_CACHE = "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"
# flashinfer/jit/cubin_loader.py and vllm/utils/flashinfer.py (FLASHINFER_CUBINS_REPOSITORY)
CUBIN_CDN = "https://edge.urm.nvidia.com/artifactory/sw-kernelinferencelibrary-public-generic-local/"
HARMONY_VOCAB_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
DEFAULT_CUDA_HOME = "/usr/local/cuda"
NVCC_TIMEOUT = 30.0

# nvcc release that first targets a capability, for when --list-gpu-code fails.
# CUDA toolkit release notes: 12.0 Hopper, 12.8 sm_100/sm_120, 12.9 sm_103/sm_121, 13.0 sm_110.
NVCC_FIRST = {(9, 0): (12, 0), (10, 0): (12, 8), (10, 3): (12, 9), (11, 0): (13, 0), (12, 0): (12, 8),
              (12, 1): (12, 9)}
# DeepGEMM's JIT refuses older nvcc ("NVCC version must be at least 12.9", in the binary).
DEEPGEMM_MIN_NVCC = (12, 9)
# vLLM's support_deep_gemm (vllm/platforms/cuda.py): 9.0, 10.x, 12.x.
DEEPGEMM_CAPS = ((9, 0),)
DEEPGEMM_MAJORS = (10, 12)

# Where a CUDA toolkit from PyPI wheels puts nvcc (CUDA 13 and CUDA 12 layouts).
WHEEL_NVCC = ("nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc")
DEEPGEMM_FILES = ("vllm/third_party/deep_gemm/_C_extension.abi3.so", "deep_gemm")
TITLES = {
    "runtime.flashinfer-cubin": "FlashInfer's precompiled cubins match FlashInfer",
    "runtime.jit-nvcc": "Kernels JIT-compiled at run time have an nvcc",
    "runtime.downloads": "Nothing is downloaded at run time",
}


def norm_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip().lower())


def installed_packages(site_packages: Sequence[str]) -> Dict[str, str]:
    """Normalised distribution name -> version, from dist-info (imports nothing)."""
    import importlib.metadata as md

    out: Dict[str, str] = {}
    for dist in md.distributions(path=list(site_packages)):
        name = dist.metadata.get("Name")
        if name:
            out.setdefault(norm_dist(name), dist.version)
    return out


def _in_site(site_packages: Sequence[str], rel: str) -> Optional[str]:
    for sp in site_packages:
        path = os.path.join(sp, rel)
        if os.path.exists(path):
            return path
    return None


# --- finding nvcc -------------------------------------------------------------


@dataclass
class Nvcc:
    path: str
    found_by: str  # how it was found: "CUDA_HOME", "PATH", "nvidia-cuda-nvcc wheel", ...
    version: Optional[Tuple[int, int]] = None
    targets: Optional[List[str]] = None  # `--list-gpu-code`, e.g. ["sm_120", "sm_121"]
    missing: List[str] = field(default_factory=list)  # toolkit parts nvcc needs to compile
    error: str = ""

    def usable(self) -> bool:
        return self.version is not None and not self.missing and not self.error

    def targets_capability(self, cap: Capability) -> bool:
        if self.targets is not None:
            return any(t.kind is CodeKind.SASS and t.capability == cap for t in _parse_targets(self.targets))
        first = NVCC_FIRST.get((cap.major, cap.minor))
        return bool(self.version and first and self.version >= first)

    def describe(self) -> str:
        ver = f"{self.version[0]}.{self.version[1]}" if self.version else "unknown version"
        extra = f", missing {', '.join(self.missing)}" if self.missing else ""
        return f"nvcc {ver} at {self.path} ({self.found_by}{extra}{', ' + self.error if self.error else ''})"

    def to_json(self) -> dict:
        return {"path": self.path, "found_by": self.found_by,
                "version": f"{self.version[0]}.{self.version[1]}" if self.version else None,
                "targets": self.targets, "missing": self.missing, "error": self.error or None}


def _parse_targets(names: Iterable[str]) -> List[CodeTarget]:
    out = []
    for name in names:
        try:
            out.append(CodeTarget.parse(name))
        except ArchError:
            continue
    return out


def _run(argv: List[str]) -> Tuple[int, str]:
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=NVCC_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return -1, str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "replace")


def _missing_parts(path: str) -> List[str]:
    """Toolkit parts nvcc runs to compile (ptxas, cicc) that are absent. `--dryrun`
    prints where nvcc looks (its own bin and CICC_PATH), which also sees through
    wrapper scripts; compiles nothing and needs no input file."""
    rc, out = _run([path, "--dryrun", "-c", "qualify-probe.cu", "-o", os.devnull])
    here = re.search(r"^#\$ _HERE_=(.*)$", out, re.M)
    cicc = re.search(r"^#\$ CICC_PATH=(.*)$", out, re.M)
    if not (here and cicc):
        root = os.path.dirname(os.path.dirname(os.path.realpath(path)))
        bin_dir, cicc_dir = os.path.join(root, "bin"), os.path.join(root, "nvvm", "bin")
    else:
        bin_dir, cicc_dir = here.group(1).strip(), cicc.group(1).strip()
    parts = {"ptxas": os.path.join(bin_dir, "ptxas"), "nvvm/bin/cicc": os.path.join(cicc_dir, "cicc")}
    return [name for name, where in parts.items() if not os.path.exists(where)]


def inspect_nvcc(path: str, found_by: str) -> Nvcc:
    """Version, targets and toolkit completeness of one nvcc."""
    info = Nvcc(path, found_by)
    info.missing = _missing_parts(path)
    rc, out = _run([path, "--version"])
    m = re.search(r"release (\d+)\.(\d+)", out)
    if rc != 0 or not m:
        info.error = f"`nvcc --version` failed: {out.strip()[-200:] or rc}"
        return info
    info.version = (int(m.group(1)), int(m.group(2)))
    rc, out = _run([path, "--list-gpu-code"])
    if rc == 0:
        info.targets = re.findall(r"\bsm_\d+[af]?\b", out)
    return info


def cuda_home(env: Mapping[str, str], given: Optional[str]) -> Tuple[str, str]:
    """(CUDA home, how) as torch, FlashInfer and DeepGEMM resolve it: CUDA_HOME,
    CUDA_PATH, the directory above `nvcc` on PATH, then /usr/local/cuda."""
    if given:
        return given, "CUDA_HOME"
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            return env[var], var
    on_path = shutil.which("nvcc", path=env.get("PATH", ""))
    if on_path:
        return os.path.dirname(os.path.dirname(on_path)), "PATH"
    return DEFAULT_CUDA_HOME, "default /usr/local/cuda"


def runtime_nvcc(env: Mapping[str, str], given_home: Optional[str], override_var: str) -> Optional[Tuple[str, str]]:
    """(nvcc path, how found) a JIT consumer would run, or None. `override_var` is the
    consumer's own variable (FLASHINFER_NVCC, DG_JIT_NVCC_COMPILER)."""
    if override_var and env.get(override_var):
        return env[override_var], override_var
    home, how = cuda_home(env, given_home)
    path = os.path.join(home, "bin", "nvcc")
    return (path, how) if os.path.isfile(path) and os.access(path, os.X_OK) else None


def wheel_nvcc(site_packages: Sequence[str]) -> Optional[str]:
    for rel in WHEEL_NVCC:
        found = _in_site(site_packages, rel)
        if found:
            return found
    return None


def toolchain(site_packages: Sequence[str], cuda_home_dir: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None) -> dict:
    """The JIT toolchain as providers.predict() wants it: the nvcc and ninja vLLM's
    has_flashinfer() and FlashInfer's JIT would use."""
    env = os.environ if env is None else env
    found = runtime_nvcc(env, cuda_home_dir, "FLASHINFER_NVCC")
    nvcc = inspect_nvcc(*found) if found else None
    ok = nvcc is not None and nvcc.usable()
    return {"nvcc": nvcc.path if ok else None,
            "nvcc_version": f"{nvcc.version[0]}.{nvcc.version[1]}" if ok and nvcc.version else None,
            "nvcc_targets": nvcc.targets if ok else None,
            "ninja": shutil.which("ninja", path=env.get("PATH", "")),
            "detail": nvcc.to_json() if nvcc else None, "wheel_nvcc": wheel_nvcc(site_packages)}


# --- runtime.flashinfer-cubin -------------------------------------------------


# What FlashInfer 0.7.2.post1 fetches (flashinfer/artifacts.py ArtifactPath; flashinfer/deep_gemm.py), and for
# which GPUs: none of it is 12.x code, so on 12.x no provider vLLM 0.33 selects runs it.
FETCHED = ("trtllm-gen FMHA, batched-GEMM and GEMM cubins (sm100f, sm103a, sm107a), cuDNN SDPA's sm100 cubins, "
           "CuTe-DSL FMHA (sm_100a, sm_103a, sm_107a, sm_110a) and DeepGEMM (10.0, 10.3, 10.7)")
NOT_ON_12X = ("on 12.x FlashInfer's paths in vLLM 0.33 (FlashInfer attention with its XQA decode kernel, the CUTLASS "
              "and b12x MoE) are compiled at first use (runtime.jit-nvcc) and fetch nothing")
CUBIN_REPORT = "flashinfer-ai/flashinfer#2941"


def _cubin_note(users: Optional[Sequence[str]], cap: Optional[Capability]) -> str:
    where = f"on {cap}" if cap is not None else "on this target"
    if users is None:
        return f"which of vLLM's providers {where} run them was not said, so they are taken to be needed"
    return (f"{where} vLLM's providers run them: {'; '.join(users)}" if users else
            f"{where} no provider vLLM 0.33 can select runs them (FlashInfer fetches {FETCHED}; {NOT_ON_12X})")


def check_flashinfer_cubin(packages: Mapping[str, str], env: Mapping[str, str],
                           users: Optional[Sequence[str]] = None, cap: Optional[Capability] = None) -> CheckResult:
    """`users`: the target's providers that run FlashInfer's downloaded cubins (probe/cubinusers.py); None: not
    known, so needed. A mismatch or a missing wheel is a failure where they are needed, a pass where none is."""
    fi, cubin, cache = packages.get(FI), packages.get(FI_CUBIN), packages.get(FI_JIT_CACHE)
    ev = {"flashinfer-python": fi, "flashinfer-cubin": cubin, "flashinfer-jit-cache": cache,
          "FLASHINFER_CUBIN_DIR": env.get("FLASHINFER_CUBIN_DIR"),
          "cubin_users": None if users is None else list(users)}
    cid, title = "runtime.flashinfer-cubin", TITLES["runtime.flashinfer-cubin"]
    if fi is None:
        return CheckResult(cid, title, PASS, "FlashInfer is not installed: no cubins to fetch", True, ev)
    if env.get("FLASHINFER_CUBIN_DIR"):
        return CheckResult(cid, title, PASS, f"FLASHINFER_CUBIN_DIR={env['FLASHINFER_CUBIN_DIR']} overrides the "
                           "package (flashinfer/jit/env.py); its contents are not checked here", True, ev)
    if cubin == fi:
        return CheckResult(cid, title, PASS, f"flashinfer-cubin {cubin} matches flashinfer-python {fi}", True, ev)
    if cubin is None:
        what = (f"flashinfer-cubin is not installed beside flashinfer-python {fi}: FlashInfer fetches its cubins "
                f"from {CUBIN_CDN} when a path first uses them")
    else:
        what = (f"flashinfer-cubin {cubin} differs from flashinfer-python {fi}: FlashInfer requires the exact version "
                "and ignores the wheel (flashinfer/jit/env.py _check_cubin_version), while vLLM's check sees the "
                "package regardless of version (vllm/utils/flashinfer.py has_flashinfer_cubin) and takes them as "
                f"present: FlashInfer fetches them from {CUBIN_CDN} when a path first uses them")
    if users is not None and not users:
        return CheckResult(cid, title, PASS, f"{what}; {_cubin_note(users, cap)}: nothing is fetched here", True, ev)
    return CheckResult(cid, title, FAIL, f"{what}; {_cubin_note(users, cap)}: air-gapped their first use fails "
                       f"({CUBIN_REPORT}), so the image is not self-sufficient. Ship them in the image: "
                       f"flashinfer-cubin=={fi} (none on PyPI for 0.7.x, whose newest is 0.6.13, and vLLM 0.33.0 "
                       "requires flashinfer-python==0.7.2.post1), or `python -m flashinfer download-cubin` at build "
                       "time with FLASHINFER_CUBIN_DIR set in the image", True, ev)


# --- runtime.jit-nvcc ---------------------------------------------------------


@dataclass
class Consumer:
    name: str
    why: str
    override_var: str  # the consumer's own nvcc variable ("" when it has none)
    min_version: Tuple[int, int] = (0, 0)
    hard: bool = False  # vLLM uses it by default: a missing compiler breaks serving, not one model


def _deepgemm_applies(cap: Optional[Capability]) -> bool:
    return cap is None or (cap.major, cap.minor) in DEEPGEMM_CAPS or cap.major in DEEPGEMM_MAJORS


def jit_consumers(packages: Mapping[str, str], site_packages: Sequence[str],
                  cap: Optional[Capability]) -> List[Consumer]:
    """Who would run nvcc at first use in this image."""
    out = []
    fi, cache = packages.get(FI), packages.get(FI_JIT_CACHE)
    if fi and not (cache and (cache == fi or cache.startswith(fi + "+"))):
        have = f"flashinfer-jit-cache {cache} does not match" if cache else "no flashinfer-jit-cache for"
        # On 10.x FlashInfer is vLLM's first attention backend, and with flashinfer-cubin
        # installed vLLM enables FlashInfer MoE and GEMM kernels without looking for nvcc.
        hard = (cap is not None and cap.major == 10) or FI_CUBIN in packages
        out.append(Consumer("FlashInfer", f"{have} flashinfer-python {fi}: FlashInfer JIT-compiles its modules "
                                          "with nvcc and ninja (flashinfer/jit/cpp_ext.py)",
                            "FLASHINFER_NVCC", hard=hard))
    if "vllm" in packages or "deep-gemm" in packages:
        found = [p for p in (_in_site(site_packages, rel) for rel in DEEPGEMM_FILES) if p] if site_packages else []
        if (found or not site_packages or "deep-gemm" in packages) and _deepgemm_applies(cap):
            out.append(Consumer("DeepGEMM", "DeepGEMM (vllm/third_party/deep_gemm in vLLM 0.33.0) JIT-compiles its "
                                            "FP8/FP4 GEMMs with nvcc >= 12.9 for block-scaled FP8 models",
                                "DG_JIT_NVCC_COMPILER", DEEPGEMM_MIN_NVCC))
    if "tilelang" in packages:
        out.append(Consumer("TileLang", "TileLang kernels (vllm/model_executor/kernels/mhc) are compiled at first "
                                        "use for the models that use them (CUDA_HOME's nvcc)", ""))
    return out


def _consumer_problem(c: Consumer, nvcc: Optional[Nvcc], ninja: Optional[str],
                      cap: Optional[Capability]) -> Optional[str]:
    if nvcc is None:
        return "no nvcc at CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda"
    if not nvcc.usable():
        return nvcc.describe()
    if nvcc.version is not None and nvcc.version < c.min_version:
        return f"{nvcc.describe()} is older than {c.min_version[0]}.{c.min_version[1]}"
    if cap is not None and not nvcc.targets_capability(cap):
        return f"{nvcc.describe()} cannot target {cap}"
    if c.name == "FlashInfer" and not ninja:
        return "no ninja on PATH"
    return None


def check_jit_nvcc(packages: Mapping[str, str], site_packages: Sequence[str], given_home: Optional[str],
                   cap: Optional[Capability], env: Mapping[str, str]) -> CheckResult:
    cid, title = "runtime.jit-nvcc", TITLES["runtime.jit-nvcc"]
    consumers = jit_consumers(packages, site_packages, cap)
    ninja = shutil.which("ninja", path=env.get("PATH", ""))
    wheel = wheel_nvcc(site_packages)
    ev: dict = {"consumers": [c.name for c in consumers], "ninja": ninja, "wheel_nvcc": wheel, "nvcc": {}}
    if not consumers:
        return CheckResult(cid, title, PASS, "nothing in the image JIT-compiles with nvcc for this target", True, ev)
    hard, soft, fine = [], [], []
    seen: Dict[Tuple[str, str], Nvcc] = {}
    for c in consumers:
        found = runtime_nvcc(env, given_home, c.override_var)
        nvcc = None
        if found:
            nvcc = seen[found] = seen.get(found) or inspect_nvcc(*found)
        ev["nvcc"][c.name] = nvcc.to_json() if nvcc else None
        problem = _consumer_problem(c, nvcc, ninja, cap)
        if problem is None:
            fine.append(f"{c.name}: {nvcc.describe() if nvcc else ''}")
            continue
        text = f"{c.name}: {problem}; {c.why}"
        if wheel and nvcc is None:
            text += f" (an nvcc wheel is at {wheel}, but nothing points CUDA_HOME or PATH at it)"
        (hard if c.hard else soft).append(text)
    if hard:
        return CheckResult(cid, title, FAIL, "vLLM would use these by default and they cannot compile: "
                           + " | ".join(hard + soft), True, ev)
    if soft:
        return CheckResult(cid, title, WARN, "these compile at first use for some models and cannot here: "
                           + " | ".join(soft), True, ev)
    return CheckResult(cid, title, PASS, "JIT compilation at first use can run (first requests are slow): "
                       + " | ".join(fine), True, ev)


# --- runtime.downloads --------------------------------------------------------


def _harmony(packages: Mapping[str, str], env: Mapping[str, str]) -> Optional[str]:
    """openai-harmony fetches the gpt-oss vocabulary at first use (vllm-project/vllm#22525,
    openai/harmony#46); vLLM 0.33.0's oss-harmony 0.0.11 fork loaded it with no network here."""
    if "openai-harmony" not in packages:
        return None
    base = env.get("TIKTOKEN_ENCODINGS_BASE")
    if base and os.path.isfile(os.path.join(base, "o200k_base.tiktoken")):
        return None
    return (f"openai-harmony {packages['openai-harmony']} downloads o200k_base.tiktoken from {HARMONY_VOCAB_URL} "
            "the first time a gpt-oss (Harmony) model runs (vllm-project/vllm#22525): ship the file and set "
            "TIKTOKEN_ENCODINGS_BASE")


def _cubin_fetch(packages: Mapping[str, str], env: Mapping[str, str], users: Optional[Sequence[str]],
                 cap: Optional[Capability]) -> Tuple[Optional[str], Optional[str]]:
    """(the fetch, a note): a fetch where the target's providers run the cubins, a note where none does."""
    fi, cubin = packages.get(FI), packages.get(FI_CUBIN)
    if fi is None or env.get("FLASHINFER_CUBIN_DIR") or cubin == fi:
        return None, None
    url = env.get("FLASHINFER_CUBINS_REPOSITORY", CUBIN_CDN)
    have = f"flashinfer-cubin {cubin or 'not installed'}, flashinfer-python {fi}"
    if users is not None and not users:
        return None, (f"FlashInfer would fetch its cubins from {url} for the paths that run them ({have}), but "
                      f"{_cubin_note(users, cap)}")
    return (f"FlashInfer downloads its cubins from {url} into ~/.cache/flashinfer/cubins at first use ({have}; see "
            f"runtime.flashinfer-cubin); {_cubin_note(users, cap)} ({CUBIN_REPORT})"), None


def _notes(env: Mapping[str, str], packages: Mapping[str, str]) -> List[str]:
    """Network use that fails harmlessly air-gapped: evidence, not findings."""
    out = []
    if packages.get(FI) and FI_CUBIN not in packages:
        out.append("without flashinfer-cubin vLLM asks the cubin server at start-up whether it answers (5 s "
                   "time-out air-gapped: vllm/utils/flashinfer.py has_nvidia_artifactory) and then does without "
                   "trtllm-gen and XQA attention")
    if env.get("HF_HUB_OFFLINE") not in ("1", "true", "True", "YES", "yes"):
        out.append("HF_HUB_OFFLINE is not set: model and tokenizer names resolve against the Hugging Face Hub "
                   "(serve a local path or set HF_HUB_OFFLINE=1 air-gapped)")
    if not (env.get("VLLM_NO_USAGE_STATS") == "1" or env.get("DO_NOT_TRACK") == "1"):
        out.append("vLLM reports usage to https://stats.vllm.ai unless VLLM_NO_USAGE_STATS=1 or DO_NOT_TRACK=1 "
                   "(vllm/usage/usage_lib.py)")
    return out


def check_downloads(packages: Mapping[str, str], env: Mapping[str, str], users: Optional[Sequence[str]] = None,
                    cap: Optional[Capability] = None) -> CheckResult:
    """Every run-time download found is a failure: `offline` (evidence) is the image's air-gap self-sufficiency,
    false as soon as one is found. `users` as for check_flashinfer_cubin."""
    cid, title = "runtime.downloads", TITLES["runtime.downloads"]
    cubins, unused = _cubin_fetch(packages, env, users, cap)
    fetches = [f for f in (cubins, _harmony(packages, env)) if f]
    ev = {"fetches": fetches, "notes": _notes(env, packages), "harmony": None, "offline": not fetches,
          "flashinfer_cubins": unused}
    if "oss-harmony" in packages:
        ev["harmony"] = (f"oss-harmony {packages['oss-harmony']} (vLLM 0.33.0's fork) embeds its vocabularies: "
                         "0.0.11 loaded the gpt-oss encoding with no network")
    if fetches:
        return CheckResult(cid, title, FAIL, "not air-gap self-sufficient: " + " | ".join(fetches), True, ev)
    said = "no run-time download found (FlashInfer cubins, Harmony vocabulary)"
    return CheckResult(cid, title, PASS, f"{said}; {unused}" if unused else said, True, ev)


def check(packages: Mapping[str, str], site_packages: Sequence[str], cuda_home: Optional[str], *,
          capability: Optional[Capability] = None, env: Optional[Mapping[str, str]] = None,
          cubin_users: Optional[Sequence[str]] = None) -> List[CheckResult]:
    """runtime.flashinfer-cubin, runtime.jit-nvcc and runtime.downloads for one image. `cubin_users`: the
    target's providers that run FlashInfer's downloaded cubins (probe/cubinusers.py; None: not known)."""
    env = os.environ if env is None else env
    pkgs = {norm_dist(k): str(v) for k, v in packages.items()}
    return [check_flashinfer_cubin(pkgs, env, cubin_users, capability),
            check_jit_nvcc(pkgs, site_packages, cuda_home, capability, env),
            check_downloads(pkgs, env, cubin_users, capability)]
