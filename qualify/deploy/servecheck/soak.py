"""serve.soak: bounded concurrent load against a server on this host, and the server's memory around it."""

from __future__ import annotations

import ipaddress
import os
import re
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from qualify.core.enums import CheckStatus
from qualify.deploy.servecheck.client import ServerError, Streamed, stream_chat
from qualify.deploy.servecheck.result import CheckResult, failed, not_run, passed
from qualify.host import cmd
from qualify.probe import servematrix as sm

SOAK = "serve.soak"
MIB = 1 << 20
_SIZE = re.compile(r"([0-9.]+)\s*([KMGT]?i?B)", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- the server's memory ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """How to read the server's memory, and what that reading is of."""

    read: Callable[[], Optional[int]]  # bytes, None when it cannot be read now
    source: str


def container_memory(engine_cli: str, container: str) -> Memory:
    """The container's memory as the engine reports it (`stats`: the cgroup's use, without the page cache)."""
    def read() -> Optional[int]:
        out = cmd.ask([engine_cli, "stats", "--no-stream", "--format", "{{.MemUsage}}", container], timeout=60)
        m = _SIZE.match(out.stdout.strip()) if out.returncode == 0 else None
        return int(float(m.group(1)) * _UNITS[m.group(2).lower()]) if m else None

    return Memory(read, f"container {container[:12]} ({os.path.basename(engine_cli)} stats)")


def _listener_inodes(port: int) -> set:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read(1 << 22).splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            parts = row.split()
            if len(parts) > 9 and parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                found.add(parts[9])
    return found


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _stat(pid: int) -> Tuple[str, int, int]:
    """(name, parent pid, resident bytes) of a process."""
    with open(f"/proc/{pid}/stat") as fh:
        text = fh.read(4096)
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    return name, int(fields[1]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def process_memory(port: int) -> Optional[Memory]:
    """The resident memory of the process listening on `port` and all its descendants (vLLM's engine core and
    workers are children of its API server); None when no process of this host listens there, or the one that
    does is a proxy (docker-proxy: the server is in a container this run does not know)."""
    inodes = {f"socket:[{i}]" for i in _listener_inodes(port)}
    owner = None
    for pid in _pids():
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{pid}/fd")):
                owner = pid
                break
        except OSError:
            continue
    if owner is None:
        return None
    name = _stat(owner)[0]
    if "proxy" in name:
        return None

    def read() -> Optional[int]:
        stats = {}
        for pid in _pids():
            try:
                stats[pid] = _stat(pid)
            except (OSError, ValueError, IndexError):
                continue
        if owner not in stats:
            return None
        tree, grew = {owner}, True
        while grew:
            more = {p for p, (_, parent, _) in stats.items() if parent in tree} - tree
            tree |= more
            grew = bool(more)
        return sum(stats[p][2] for p in tree)

    return Memory(read, f"process tree of pid {owner} ({name}) listening on port {port}")


# --- the soak --------------------------------------------------------------------------------------------


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))] if ordered else 0.0


def soak(url: str, model: str, s: sm.Soak, memory: Optional[Memory], why_no_memory: str = "") -> CheckResult:
    if not is_loopback(url):
        return not_run(SOAK, f"{url} is not on this host (a loopback address): the soak loads only a server of ours")
    prompts = [s.prompts[i % len(s.prompts)] for i in range(s.requests)]
    try:
        for p in prompts[:s.warmup_requests]:
            stream_chat(url, model, p, s.max_tokens)
    except ServerError as exc:
        return failed(SOAK, f"the warm-up request failed: {exc}")
    before = memory.read() if memory else None
    deadline = time.monotonic() + s.max_seconds
    results: List[Streamed] = []
    errors: List[str] = []
    lock = threading.Lock()

    def one(prompt: str) -> None:
        if time.monotonic() >= deadline:
            return
        try:
            done = stream_chat(url, model, prompt, s.max_tokens, timeout=max(1.0, deadline - time.monotonic()))
        except ServerError as exc:
            with lock:
                errors.append(str(exc))
            return
        with lock:
            results.append(done)

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=s.concurrency) as pool:
        list(pool.map(one, prompts))
    wall = time.monotonic() - began
    after = memory.read() if memory else None
    return _judge(s, results, errors, wall, before, after, memory, why_no_memory)


def _judge(s: sm.Soak, results: List[Streamed], errors: List[str], wall: float, before: Optional[int],
           after: Optional[int], memory: Optional[Memory], why_no_memory: str) -> CheckResult:
    latencies = [r.latency_s for r in results]
    ttfts = [r.ttft_s for r in results]
    tokens = sum(r.tokens for r in results)
    figures = {"soak_requests": float(len(results)), "soak_errors": float(len(errors)),
               "soak_p50_latency_s": round(_quantile(latencies, 0.5), 4),
               "soak_p99_latency_s": round(_quantile(latencies, 0.99), 4),
               "soak_p50_ttft_s": round(_quantile(ttfts, 0.5), 4), "soak_p99_ttft_s": round(_quantile(ttfts, 0.99), 4),
               "soak_tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0}
    bound = None
    if before is not None and after is not None:
        bound = max(s.max_memory_growth_mib * MIB, s.max_memory_growth_fraction * before)
        figures.update(soak_memory_before_mib=round(before / MIB, 1), soak_memory_after_mib=round(after / MIB, 1),
                       soak_memory_growth_mib=round((after - before) / MIB, 1))
    evidence = {"concurrency": s.concurrency, "requests": s.requests, "completed": len(results), "errors": errors[:5],
                "seconds": round(wall, 2), "max_seconds": s.max_seconds, "max_tokens": s.max_tokens,
                "completion_tokens": tokens, "memory_source": memory.source if memory else why_no_memory,
                "memory_bound_mib": round(bound / MIB, 1) if bound is not None else None, **figures}
    summary = (f"{len(results)} of {s.requests} requests, {s.concurrency} at a time, in {wall:.1f} s: p50/p99 latency "
               f"{figures['soak_p50_latency_s']:.3f}/{figures['soak_p99_latency_s']:.3f} s, time to first token "
               f"p50 {figures['soak_p50_ttft_s']:.3f} s, {figures['soak_tokens_per_s']:g} tokens/s")
    if errors:
        return failed(SOAK, f"{len(errors)} of {s.requests} requests failed ({errors[0]}); {summary}", evidence,
                      **figures)
    if bound is not None and after - before > bound:
        return failed(SOAK, f"the server's memory grew by {(after - before) / MIB:.0f} MiB (bound {bound / MIB:.0f} MiB); "
                      f"{summary}", evidence, **figures)
    if len(results) < s.requests:
        return CheckResult(SOAK, CheckStatus.WARN, f"the time bound ({s.max_seconds:g} s) ended the soak; {summary}",
                           evidence, figures)
    if bound is None:
        return not_run(SOAK, f"no errors, but the server's memory could not be read "
                       f"({why_no_memory or (memory.source if memory else 'no source')}); {summary}", evidence,
                       **figures)
    return passed(SOAK, f"{summary}; 0 errors; memory {before / MIB:.0f} -> {after / MIB:.0f} MiB (bound +"
                  f"{bound / MIB:.0f} MiB, {memory.source})", evidence, **figures)
