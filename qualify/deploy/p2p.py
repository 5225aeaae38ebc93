"""The all-reduce gate's P2P part: the probe's gpu.p2p check (probe/p2p.py) on exactly the server's GPUs, under
exactly its collective settings, weighed against how the server will use P2P.

It passes when the driver's report of P2P and a real transfer agree for every pair (whether there is P2P or
not: without it vLLM and NCCL go through host memory, slower, not wrong), and says whether vLLM's custom
all-reduce will run. It refuses when the driver reports P2P that a transfer does not bear out, or CUDA IPC
does not work in the container, unless the server uses P2P in neither NCCL (NCCL_P2P_DISABLE=1) nor its own
all-reduce (--disable-custom-all-reduce): then it passes with a warning. A refusal names what preflight
found on this host's IOMMU and PCIe bridges (iommu.py) as the likely cause, with its fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from qualify.deploy.collectives import DISABLE_CUSTOM_ALL_REDUCE, ServerCollectives
from qualify.deploy.iommu import P2pHost
from qualify.probe.p2p import P2P_CHECK

WITHOUT_P2P = (f"or serve without P2P (slower): CONTAINER_ENV_NCCL_P2P_DISABLE=1 and {DISABLE_CUSTOM_ALL_REDUCE} in "
               "EXTRA_SERVE_ARGS")
LOOK = ("look at the IOMMU (boot with iommu=pt) and the ACS bits of the GPUs' PCIe bridges (sudo lspci -vvv | grep "
        "ACSCtl; ReqRedir+ or CmpltRedir+ sends P2P through the root complex)")


@dataclass(frozen=True)
class P2pVerdict:
    ok: bool
    reason: str  # what was found; why not when not ok
    fix: str = ""
    warning: str = ""  # a pass the user should know about


def _check(predicate: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    found = [c for c in predicate.get("checks") or () if isinstance(c, Mapping) and c.get("id") == P2P_CHECK]
    return found[0] if len(found) == 1 else None


def _custom_all_reduce(evidence: Mapping[str, Any], collectives: ServerCollectives) -> Tuple[bool, str]:
    said = evidence.get("custom_all_reduce") if isinstance(evidence.get("custom_all_reduce"), Mapping) else {}
    if not collectives.custom_all_reduce:
        return False, f"off ({DISABLE_CUSTOM_ALL_REDUCE} in EXTRA_SERVE_ARGS); vLLM all-reduces through NCCL"
    if said.get("enabled") is True:
        return True, f"on ({said.get('reason')})"
    return False, f"off ({said.get('reason') or 'not reported'}); vLLM all-reduces through NCCL"


def judge(predicate: Mapping[str, Any], collectives: ServerCollectives, host: Optional[P2pHost]) -> P2pVerdict:
    check = _check(predicate)
    if check is None:
        return P2pVerdict(False, f"the probe reported no {P2P_CHECK} result (or more than one)")
    evidence = check.get("evidence") if isinstance(check.get("evidence"), Mapping) else {}
    status, reason = check.get("status"), check.get("reason")
    if status == "not-run":
        return P2pVerdict(False, f"{P2P_CHECK} did not run: {reason}")
    seen = evidence.get("env")
    differs = collectives.env.differences(seen) if isinstance(seen, Mapping) else ["no environment reported"]
    if differs:
        return P2pVerdict(False, f"{P2P_CHECK} ran under {', '.join(differs[:3])} (the server's)")
    if status == "pass":
        _, custom = _custom_all_reduce(evidence, collectives)
        return P2pVerdict(True, f"{reason.split(';')[0]}; vLLM's custom all-reduce {custom}")
    cause = f"; preflight found: {host.problem}" if host and host.problem else ""
    nccl_off = collectives.env.get("NCCL_P2P_DISABLE") == "1"
    skipping = collectives.env.get("VLLM_SKIP_P2P_CHECK") == "1"
    if nccl_off and (not collectives.custom_all_reduce or not skipping):
        return P2pVerdict(True, f"{P2P_CHECK} {status}, but the server does not use P2P (NCCL_P2P_DISABLE=1"
                          + (f", {DISABLE_CUSTOM_ALL_REDUCE}" if not collectives.custom_all_reduce else
                             "; vLLM's own transfer test turns its custom all-reduce off") + ")",
                          warning=f"P2P does not work on this host: {reason}{cause}")
    fix = host.fix if host and host.fix else LOOK
    return P2pVerdict(False, f"{P2P_CHECK} {status}: {reason}{cause}", f"{fix}; {WITHOUT_P2P}")
