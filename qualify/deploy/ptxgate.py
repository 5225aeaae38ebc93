"""The PTX JIT gate (issue 51): can this host's driver JIT-compile the PTX the image runs here only by JIT?

Code with no SASS for the GPU runs by JIT-compiling its PTX, and a driver JIT-compiles PTX only up to its own
CUDA release's ISA: vLLM's FlashAttention-2 carries sm_80 SASS and compute_80 PTX only, so on 12.x it is PTX
from whatever toolkit built it, and a driver older than that toolkit fails it at the first launch with
CUDA_ERROR_UNSUPPORTED_PTX_VERSION (vllm-project/vllm#47397, #31700). The verified manifest says the newest
PTX ISA the image needs on its target (`predicate.census.ptx_jit`, probe/census_check.py); the verified
release's policy says which driver first JITs each ISA (`ptx_jit`, trust/ptxfloors.py, signed from
images/targets.toml `[ptx_jit]`). Never this checkout's targets file.

After the trust gate, before anything is pulled. A driver too old is refused with both numbers (the ISA the
image needs and the newest this driver JITs) and the driver branch that would; what cannot be judged (no
signed table: a release signed before it or the registry-only path, whose release statement signs no policy;
an ISA the census could not read; an ISA newer than the table) is refused too: unknown is never a pass. Exit
3, preflight's: like the driver's CUDA floor it is a fact of this host's driver. `--allow-unqualified`
overrides, loudly, as every gate refusal. A manifest from before issue 51 records nothing: said, not passed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, List, Optional, Protocol, Sequence, Tuple

from qualify.core import ptxisa
from qualify.core.driver import DriverVersion
from qualify.core.ptxjit import PtxJitFloor, PtxNeeds, floor_for, shortfall
from qualify.deploy.preflight import HostPlan
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui
from qualify.trust.verify import VerifiedRelease

REPORTS = "vllm-project/vllm#47397, #31700"
FAILS_AS = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222: the provided PTX was compiled with an unsupported toolchain)"


class Deploying(Protocol):
    """What the gate needs of run.Deploy."""

    plan: HostPlan
    opts: Any  # run.Options: allow_unqualified
    ui: Ui
    target: str


def signed(release: VerifiedRelease) -> Optional[Tuple[PtxJitFloor, ...]]:
    """The table a verified release's policy signs; None where it signs none (a release signed before the
    policy, or before `ptx_jit`), so the gate says why it cannot judge."""
    policy = release.index.policy
    return policy.ptx_jit if policy is not None and policy.ptx_jit else None


def _why_unsigned(trust: Any) -> str:
    if trust.folder is None:
        return ("the image was trusted from its registry attestation alone, whose release statement signs no policy "
                "and so no PTX JIT table")
    return f"release {trust.tag or '(none)'} signs no PTX JIT table (signed before issue 51 or without [ptx_jit])"


def problems(needs: PtxNeeds, table: Optional[Sequence[PtxJitFloor]], driver_text: str, trust: Any,
             where: str) -> Tuple[List[str], List[str]]:
    """(refusals, fixes) for a manifest that records its needs; empty when this driver JITs all of it."""
    isa = needs.highest_isa
    if needs.unknown_units:
        unread = [x for x in needs.libraries if any(i == ptxisa.UNKNOWN for i, _ in x.isa)]
        return ([f"{needs.unknown_units} unit(s) run on this GPU only by PTX JIT and the census could not read their "
                 f"PTX ISA ({', '.join(x.describe() for x in unread[:4])}), so no driver can be said to JIT them "
                 f"({where}): unknown is never a pass"],
                ["deploy a release qualified with the probe's decoders (its census reads compressed PTX)"])
    if table is None:
        return ([f"code runs on this GPU only by PTX JIT and needs PTX ISA {isa} ({needs.naming(isa)}), and "
                 f"{_why_unsigned(trust)}: which drivers JIT it cannot be judged"],
                ["deploy from a release folder signed by this toolkit (RELEASE_TAG, MANIFESTS_DIR)"])
    floor = floor_for(table, isa)
    if floor is None:
        newest = max(table, key=lambda f: ptxisa.key(f.isa))
        return ([f"code runs on this GPU only by PTX JIT and needs PTX ISA {isa} ({needs.naming(isa)}), newer than "
                 f"every ISA the signed table names (newest: {newest.isa}, CUDA {newest.cuda}): which drivers JIT it "
                 f"cannot be judged ({where})"],
                ["a release whose [ptx_jit] table names that ISA (NVIDIA's PTX ISA and CUDA release notes)"])
    found = DriverVersion.maybe(driver_text)
    if found is None:
        return ([f"the host's driver version {driver_text!r} cannot be read; the image's PTX ISA {isa} needs "
                 f"{floor.driver} or newer ({where})"], ["check the driver with nvidia-smi"])
    short = shortfall(needs, table, found)
    if short is None:
        return [], []
    return ([f"{short.describe()}: {needs.naming(isa)} run on this GPU only by JIT-compiling that PTX, so their first "
             f"launch would fail with {FAILS_AS} ({REPORTS}; {where})"], [short.fix()])


def check(d: Deploying, trust: Any) -> Any:
    """After the trust gate: the verified manifest's JIT-only PTX against this host's driver, by the verified
    release's signed table (trust.ptx_jit). Returns the trust, its reason extended when --allow-unqualified
    overrides a refusal."""
    if d.plan.target.is_cpu or trust.manifest is None:  # no GPU code; or no release at all (already overridden)
        return trust
    where = f"the verified manifest of {d.target}, release {trust.tag or '(registry attestation)'}"
    try:
        needs = PtxNeeds.of(trust.manifest.predicate, d.target)
    except ValueError as exc:
        return _refuse(d, trust, [f"its census.ptx_jit cannot be read ({exc}): unknown is never a pass"],
                       ["deploy a release whose manifest is whole"])
    if not needs.recorded:
        d.ui.warn(f"PTX JIT: {where} does not record the PTX ISA its JIT-only code needs (qualified by an older "
                  "toolkit): not checked against this host's driver")
        return trust
    if not needs.needed:
        d.ui.say("PTX JIT: nothing in the image runs on this GPU only by PTX JIT")
        return trust
    refused, fixes = problems(needs, trust.ptx_jit, d.plan.gpu.driver, trust, where)
    if not refused:
        d.ui.say(f"PTX JIT: driver {d.plan.gpu.driver} JIT-compiles PTX ISA {needs.highest_isa}, the newest the image "
                 f"runs here only by JIT ({needs.naming()}; release {trust.tag}'s signed table)")
        return trust
    return _refuse(d, trust, refused, fixes)


def _refuse(d: Deploying, trust: Any, refused: List[str], fixes: List[str]) -> Any:
    reason = f"driver: PTX JIT: {'; '.join(refused)}"
    if not d.opts.allow_unqualified:
        raise Stop(EX_PREFLIGHT, f"{reason}; nothing was pulled", *fixes,
                   "or, at your own risk: ./start.sh --allow-unqualified (the JIT-only kernels are then expected to "
                   "fail at their first launch)")
    d.ui.banner(["--allow-unqualified: DEPLOYING AN IMAGE WHOSE PTX THIS DRIVER CANNOT BE SHOWN TO JIT",
                 *refused, "Kernels that run here only by PTX JIT are expected to fail at their first launch."])
    return replace(trust, reason=f"{trust.reason}; UNQUALIFIED (--allow-unqualified): PTX JIT refused")
