"""What on this host can break peer-to-peer access between the chosen GPUs: the IOMMU's mode and PCIe ACS.

Two GPUs below one PCIe switch reach each other across it, unless Access Control Services on the switch's
ports redirect their requests up to the root complex (ACS P2P Request/Completion Redirect), where an IOMMU in
translated mode then translates them as if they were DMA to memory: P2P is slow, or fails, or hangs (NCCL's
troubleshooting guide, "PCI Access Control Services"; Linux enables ACS wherever it runs an IOMMU). GPUs that
meet only at the CPU's host bridge always go through the root complex, so a translating IOMMU is on their
path. NVLink bypasses both.

Read, never changed: the IOMMU mode from each GPU's IOMMU group (/sys/kernel/iommu_groups/N/type: identity is
passthrough, DMA or DMA-FQ translated), else /sys/class/iommu and /proc/cmdline (iommu=, intel_iommu=,
amd_iommu=, iommu.passthrough=); the ACS control bits from the config space of each bridge between the GPUs
(sysfs `config`, what lspci reads: past its first 64 bytes only root can read it). Paths go through
hostfiles.py, so a test points this at a stand-in sysfs root. Preflight warns with the fix (preflight.py); the
gate's P2P check proves the effect and names this as the cause when P2P fails (p2p.py).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from qualify.core import nvsmi, topology
from qualify.deploy import hostfiles

OFF, PASSTHROUGH, TRANSLATED, UNKNOWN = "off", "passthrough", "translated", "unknown"
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
EXT_CAP_START, EXT_CAP_ID_ACS = 0x100, 0x000D
ACS_REQUEST_REDIRECT, ACS_COMPLETION_REDIRECT = 1 << 2, 1 << 3  # the ACS Control register's P2P redirect bits
ACS_FIX = ("or disable ACS on those bridges, as root: setpci -s BDF ECAP_ACS+0x6.w=0000 for each (it does not "
           "survive a reboot; NCCL's troubleshooting guide, 'PCI Access Control Services')")


@dataclass(frozen=True)
class IommuMode:
    mode: str  # OFF, PASSTHROUGH, TRANSLATED or UNKNOWN
    source: str  # where it was read


@dataclass(frozen=True)
class P2pHost:
    """What preflight found: the IOMMU's mode, the bridges between the GPUs that redirect P2P, those whose ACS
    bits could not be read; `problem` says what breaks P2P ("" when nothing does), `fix` what to do."""

    iommu: IommuMode
    redirecting: Tuple[str, ...] = ()
    unreadable: Tuple[str, ...] = ()
    problem: str = ""
    fix: str = ""
    note: str = ""


def _device_dir(bus_id: str) -> Optional[Path]:
    link = hostfiles.path("/sys/bus/pci/devices") / nvsmi.pci_name(bus_id)
    try:
        return link.resolve(strict=True)
    except (OSError, RuntimeError):
        return None


def _bridges(device: Path) -> List[Path]:
    """The PCI bridges above a device, from the root port down (its sysfs path's parents that are BDFs)."""
    return [p for p in reversed(device.parents) if BDF.fullmatch(p.name)]


def _group_type(device: Path) -> Optional[str]:
    try:
        return (device / "iommu_group" / "type").read_text().strip()
    except OSError:
        return None


def _cmdline_mode(cmdline: str) -> Optional[Tuple[str, str]]:
    args = dict(a.split("=", 1) for a in cmdline.split() if "=" in a)
    said = next((f"{k}={args[k]}" for k, v in (("iommu", "pt"), ("iommu.passthrough", "1"), ("amd_iommu", "pt"))
                 if args.get(k) == v), None)
    if said:
        return PASSTHROUGH, f"/proc/cmdline: {said}"
    said = next((f"{k}=off" for k in ("iommu", "intel_iommu", "amd_iommu") if args.get(k) == "off"), None)
    if said:
        return OFF, f"/proc/cmdline: {said}"
    said = next((f"{k}={args[k]}" for k in ("intel_iommu", "amd_iommu", "iommu", "iommu.passthrough")
                 if args.get(k) in ("on", "force", "sm_on", "nopt", "0")), None)
    if said:
        return TRANSLATED, f"/proc/cmdline: {said} without iommu=pt"
    return None


def iommu_mode(devices: Sequence[Path]) -> IommuMode:
    """The GPUs' IOMMU mode: their groups' type where the kernel says (Linux 5.11+), else the boot options."""
    for device in devices:
        kind = _group_type(device)
        if kind in ("DMA", "DMA-FQ"):
            return IommuMode(TRANSLATED, f"{device.name}'s IOMMU group type {kind}")
    kinds = [_group_type(d) for d in devices]
    if devices and all(k == "identity" for k in kinds):
        return IommuMode(PASSTHROUGH, f"the GPUs' IOMMU group type identity ({', '.join(d.name for d in devices)})")
    units = sorted(p.name for p in hostfiles.path("/sys/class/iommu").glob("*")) if \
        hostfiles.path("/sys/class/iommu").is_dir() else []
    booted = _cmdline_mode(hostfiles.read_text("/proc/cmdline") or "")
    if not units and devices and not any((d / "iommu_group").exists() for d in devices):
        return IommuMode(OFF, "no IOMMU unit in /sys/class/iommu and no IOMMU group for the GPUs")
    if booted is not None:
        return IommuMode(*booted)
    if units:
        return IommuMode(TRANSLATED, f"/sys/class/iommu lists {', '.join(units[:4])} and /proc/cmdline sets no "
                         "iommu=pt (the kernel's default then translates)")
    return IommuMode(UNKNOWN, "neither the GPUs' IOMMU groups nor /sys/class/iommu nor /proc/cmdline say")


def acs_control(config: bytes) -> Optional[int]:
    """The ACS Control register of a PCI function's config space; None without an ACS capability. Raises
    ValueError when the extended config space is not in `config` (reading it needs root)."""
    if len(config) < EXT_CAP_START + 8:
        raise ValueError(f"{len(config)} bytes of config space")
    offset, seen = EXT_CAP_START, set()
    while offset and offset not in seen and EXT_CAP_START <= offset <= len(config) - 8:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        if header & 0xFFFF == EXT_CAP_ID_ACS:
            return struct.unpack_from("<H", config, offset + 6)[0]
        offset = (header >> 20) & 0xFFC
    return None


def _redirects(bridge: Path) -> Optional[bool]:
    """Whether the bridge redirects P2P upstream; None when its ACS bits cannot be read."""
    try:
        ctrl = acs_control((bridge / "config").read_bytes()[:4096])
    except (OSError, ValueError):
        return None
    return bool(ctrl is not None and ctrl & (ACS_REQUEST_REDIRECT | ACS_COMPLETION_REDIRECT))


def _between(a: Sequence[Path], b: Sequence[Path]) -> List[Path]:
    """The bridges on the way from one GPU to the other below the deepest bridge they share."""
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return list(a[k:]) + list(b[k:]) if k else []


def inspect(bus_ids: Sequence[str], joined: topology.Topology) -> P2pHost:
    """What breaks P2P between the GPUs of these PCI bus ids (nvidia-smi's), joined as preflight read."""
    devices = [d for d in (_device_dir(b) for b in bus_ids if b) if d is not None]
    mode = iommu_mode(devices)
    if joined.kind == topology.NVLINK:
        return P2pHost(mode, note="P2P goes over NVLink: the IOMMU and PCIe ACS are not on its path")
    if len(devices) < len(bus_ids) or not devices:
        return P2pHost(mode, note=f"the GPUs' PCI devices are not in {hostfiles.path('/sys/bus/pci/devices')}: "
                       "ACS not checked")
    paths = [_bridges(d) for d in devices]
    between = sorted({p for i in range(len(paths)) for j in range(i + 1, len(paths))
                      for p in _between(paths[i], paths[j])})
    read = {p.name: _redirects(p) for p in between}
    redirecting = tuple(n for n, r in read.items() if r)
    unreadable = tuple(n for n, r in read.items() if r is None)
    translated = mode.mode == TRANSLATED
    pt = "boot with iommu=pt (with intel_iommu=on or amd_iommu=on where the platform needs them), then reboot"
    if redirecting:
        where = f"ACS redirect on the GPUs' bridges ({', '.join(redirecting)})"
        if translated:
            return P2pHost(mode, redirecting, unreadable,
                           f"IOMMU in translated mode ({mode.source}) with {where}: P2P between the GPUs goes through "
                           "the root complex, where the IOMMU translates it, or fails", f"{pt}; {ACS_FIX}")
        return P2pHost(mode, redirecting, unreadable,
                       f"{where}: P2P between the GPUs goes up through the root complex instead of across their "
                       "switch: slower, and on some platforms not at all", ACS_FIX.replace("or disable", "disable", 1))
    if translated and (not between or joined.kind in (topology.HOST_BRIDGE, topology.CROSS_SOCKET)):
        return P2pHost(mode, (), unreadable,
                       f"IOMMU in translated mode ({mode.source}) and the GPUs meet at the CPU ({joined.kind}): P2P "
                       "between them is translated by the IOMMU, which many platforms do not carry (the driver then "
                       "reports no P2P, or transfers fail)", pt)
    if unreadable:
        return P2pHost(mode, (), unreadable, note=f"the ACS bits of {', '.join(unreadable)} could not be read (past "
                       "the first 64 bytes of config space only root reads them): run as root, or check with "
                       "sudo lspci -vvv | grep ACSCtl" + (f"; the IOMMU translates ({mode.source})" if translated
                                                           else ""))
    return P2pHost(mode, note=f"IOMMU {mode.mode} ({mode.source}); no ACS redirect between the GPUs" if between else
                   f"IOMMU {mode.mode} ({mode.source})")
