"""The all-reduce gate: before a tensor-parallel server starts, the probe's NCCL collectives (gpu.nccl-allreduce)
run inside the image on exactly the GPUs it will use, and the deploy judges what they measured.

It passes only when the check passed and its evidence holds up here: NCCL (never a stand-in backend), a world
size equal to the tensor-parallel size, every rank run under the server's NCCL environment (the one value of
collectives.py, compared variable by variable with what each rank reported), every rank's sum exact, every
rank's float32 and bfloat16 results finite and within the stated tolerance of the single-GPU reference, every
all-gather slot holding its own rank's shard, the topology the container saw being the one preflight read,
and a bus bandwidth at or above the floor for that topology and GPU count. Otherwise it refuses with the
measured numbers. The run is GPU evidence of the multi-GPU configuration either way (run.py saves it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence

from qualify.core import topology
from qualify.core.ncclenv import CollectiveEnv
from qualify.probe.gpu import ALLREDUCE_CHECK


@dataclass(frozen=True)
class Judged:
    ok: bool
    reason: str  # what was measured, against what; why not when not ok
    busbw_gbs: Optional[float] = None


def _check(predicate: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    checks = predicate.get("checks") if isinstance(predicate, Mapping) else None
    found = [c for c in checks or () if isinstance(c, Mapping) and c.get("id") == ALLREDUCE_CHECK]
    return found[0] if len(found) == 1 else None


def _number(doc: Any, *keys: str) -> Optional[float]:
    for key in keys:
        doc = doc.get(key) if isinstance(doc, Mapping) else None
    return float(doc) if isinstance(doc, (int, float)) and not isinstance(doc, bool) else None


def _rank_problems(ranks: Sequence[Any], tp: int) -> List[str]:
    problems = []
    if len(ranks) != tp or sorted(r.get("rank") for r in ranks if isinstance(r, Mapping)) != list(range(tp)):
        return [f"the result holds {len(ranks)} ranks, not ranks 0..{tp - 1}"]
    for r in ranks:
        ref = r.get("reference") if isinstance(r.get("reference"), Mapping) else {}
        if r.get("all_equal") is not True:
            problems.append(f"rank {r['rank']} holds {r.get('value')!r}, not {r.get('expected')!r}")
        rows = [x for x in (ref.get("all_reduce") or []) + (ref.get("reduce_scatter") or []) if isinstance(x, Mapping)]
        if {x.get("dtype") for x in rows} != {"float32", "bfloat16"} or len(rows) != 4:
            problems.append(f"rank {r['rank']}: no float32 and bfloat16 comparison with the single-GPU reference")
        for x in rows:
            if x.get("finite") is not True or x.get("within_tolerance") is not True:
                problems.append(f"rank {r['rank']} {x.get('dtype')}: " + ("non-finite values" if x.get("finite")
                                is not True else f"error {x.get('max_abs_error')} is "
                                f"{_number(x, 'max_error_over_bound') or 0:.2f} x the tolerance"))
        gathers = [x for x in ref.get("all_gather") or [] if isinstance(x, Mapping)]
        if len(gathers) != 2 or any(x.get("slots_not_their_rank") != [] for x in gathers):
            problems.append(f"rank {r['rank']}: all-gather slots not holding their rank's shard")
    return problems


def env_problems(ranks: Sequence[Any], env: CollectiveEnv) -> List[str]:
    """Where a rank ran under other collective settings than the server's."""
    out = []
    for r in ranks:
        seen = r.get("env") if isinstance(r, Mapping) else None
        if not isinstance(seen, Mapping):
            out.append(f"rank {r.get('rank') if isinstance(r, Mapping) else '?'} reported no environment")
            continue
        differs = env.differences(seen)
        if differs:
            out.append(f"rank {r.get('rank')} ran under {', '.join(differs[:3])} (the server's)")
    return out[:2]


def judge(predicate: Mapping[str, Any], tp: int, seen: topology.Topology,
          floor: Optional[topology.AllReduceFloor], env: Optional[CollectiveEnv] = None) -> Judged:
    """The gate's verdict on one probe run (scope allreduce or gpu) for `tp` GPUs joined as `seen`; `env`, the
    server's collectives, which every rank must have run under."""
    check = _check(predicate)
    if check is None:
        return Judged(False, f"the probe reported no {ALLREDUCE_CHECK} result (or more than one)")
    evidence = check.get("evidence") if isinstance(check.get("evidence"), Mapping) else {}
    busbw = _number(evidence, "bandwidth", "busbw_gbs")
    measured = f"busbw {busbw:g} GB/s" if busbw is not None else "no bandwidth measured"
    if check.get("status") != "pass":
        return Judged(False, f"{ALLREDUCE_CHECK} {check.get('status')}: {check.get('reason')}", busbw)
    problems = []
    if evidence.get("backend") != "nccl":
        problems.append(f"the collectives ran over {evidence.get('backend')!r}, not NCCL")
    if evidence.get("world_size") != tp:
        problems.append(f"world size {evidence.get('world_size')!r}, not the tensor-parallel size {tp}")
    ranks = [r for r in evidence.get("ranks") or [] if isinstance(r, Mapping)]
    problems += _rank_problems(ranks, tp)
    if env is not None:
        problems += env_problems(ranks, env)
    try:
        inside = topology.from_json(evidence.get("topology"))
    except topology.TopologyError as exc:
        inside = None
        problems.append(f"the container's topology cannot be read: {exc}")
    if inside is not None and inside.kind != seen.kind:
        problems.append(f"inside the container the GPUs are joined by {inside.kind}, but preflight read {seen.kind} "
                        "on the host: the container was not given the GPUs preflight checked")
    if floor is None:
        problems.append(f"no all-reduce floor for {tp} GPUs joined by {seen.kind}")
    elif busbw is None or busbw < floor.min_bus_gbps:
        problems.append(f"{measured} is below the floor of {floor.min_bus_gbps:g} GB/s for {tp} GPUs joined by "
                        f"{seen.kind}")
    if problems:
        return Judged(False, "; ".join(problems[:6]), busbw)
    worst = max(_number(x, "max_error_over_bound") or 0.0 for r in evidence["ranks"]
                for x in r["reference"]["all_reduce"] + r["reference"]["reduce_scatter"])
    under = "; every rank under the server's collective settings" if env is not None else ""
    return Judged(True, f"NCCL {evidence.get('nccl')} on {tp} GPUs joined by {seen.kind}: results finite and within "
                  f"the tolerance of the single-GPU reference (worst {worst:.2f} x), shards owned; {measured}, floor "
                  f"{floor.min_bus_gbps:g} GB/s{under}", busbw)
