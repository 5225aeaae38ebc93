"""`<target>.promotion.json` (PromotionRecord): the newest promotion or demotion of one target, with a sequence one
higher than the record before it, whose sha256 it names; every record it replaced is kept beside it as
`<target>.promotion.<sequence>.json` (the ledger: a hash chain, never overwritten). Since release/v3 it is where
a promoted target's current level lives: promote no longer rewrites the manifest (issue 52)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Type

from qualify.core import manifest as mf
from qualify.core.errors import QualifyError, VerificationError
from qualify.core.fsutil import canonical_json
from qualify.trust.fields import HEX, Fields, load, parse_time
from qualify.trust.gpuconfig import SINGLE_GPU, ConfigurationRow, row_field, row_of, rows_field, rows_of

PROMOTION_SCHEMA = "https://blackwell-qualify.dev/promotion/v3"
PROMOTION_SCHEMA_V2 = "https://blackwell-qualify.dev/promotion/v2"  # before the ledger: read, never written
PROMOTION_SUFFIX = ".promotion.json"

HISTORY = re.compile(r"([a-z0-9][a-z0-9-]{0,31})\.promotion\.([1-9][0-9]{0,8})\.json")


def promotion_file(target: str) -> str:
    return f"{target}{PROMOTION_SUFFIX}"


def history_file(target: str, sequence: int) -> str:
    """Where the promotion record of `sequence` is kept once a newer one replaces it (the ledger)."""
    return f"{target}.promotion.{sequence}.json"

@dataclass(frozen=True)
class CountedEvidence:
    """One evidence record a promotion accepted: its file (under evidence/<target>/) and sha256."""

    sha256: str
    identity: str
    time: str
    outcome: str
    reason: str
    gpu: str
    driver: str
    host: str  # the enrolled host's name, or "unsigned"
    figures: Tuple[Tuple[str, float], ...] = ()
    configuration: str = SINGLE_GPU.key  # its promotion row (gpuconfig.Configuration.key); written for N GPUs only
    serving_sha256: Optional[str] = None  # the serve-check record the run counted with (issue 39), kept beside it

    def file(self, target: str) -> str:
        return f"evidence/{target}/{self.sha256}.json"

    def as_json(self, target: str) -> Dict[str, Any]:
        return {"sha256": self.sha256, "identity": self.identity, "file": self.file(target), "time": self.time,
                "outcome": self.outcome, "reason": self.reason, "gpu": self.gpu, "driver": self.driver,
                "host": self.host, "figures": dict(self.figures), **row_field(self.configuration),
                **({"serving_sha256": self.serving_sha256} if self.serving_sha256 else {})}

    @classmethod
    def parse(cls, f: Fields, target: str) -> CountedEvidence:
        f.only("sha256", "identity", "file", "time", "outcome", "reason", "gpu", "driver", "host", "figures",
               "configuration", "serving_sha256")
        sha = f.text("sha256", HEX)
        if f.text("file") != f"evidence/{target}/{sha}.json":
            raise f.error(f"{f.where}: 'file' is not evidence/{target}/{sha}.json")
        parse_time(f.text("time"), f"{f.where}: time", f.error)
        figures = f.obj("figures").doc
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in figures.values()):
            raise f.error(f"{f.where}: figures must map names to numbers")
        serving = f.optional_text("serving_sha256")
        if serving is not None and not HEX.fullmatch(serving):
            raise f.error(f"{f.where}: 'serving_sha256' is not a sha256")
        return cls(sha, f.text("identity", HEX), f.text("time"), f.text("outcome"), f.text("reason", empty=True),
                   f.text("gpu", empty=True), f.text("driver", empty=True), f.text("host"),
                   tuple(sorted((str(k), float(v)) for k, v in figures.items())), row_of(f), serving)


@dataclass(frozen=True)
class PromotionRecord:
    """A promotion or demotion of one target of one release: one link of the release's promotion ledger,
    naming the record before it (`previous_sha256`) and numbered one above it (`sequence`)."""

    release: str
    release_sha256: str
    target: str
    sequence: int
    previous_sha256: Optional[str]  # the promotion record it replaces (kept as history_file(target, sequence - 1))
    released_level: str
    level: str
    consecutive_passes: int
    required_consecutive_passes: int
    note: str
    manifest_sha256: str  # the target's manifest: release.json's (release/v3), the one it rewrote (release/v2)
    evidence: Tuple[CountedEvidence, ...] = ()
    unsigned_evidence_allowed: bool = False
    hosts_sha256: Optional[str] = None  # the enrolled-hosts file the evidence was checked against
    hosts_sequence: int = 0  # and its sequence (0: no hosts file)
    policy_version: int = 0  # the release.json policy applied (0: the implied rule of an older release)
    legacy: bool = False  # read from a promotion/v2 record (before the ledger: its predecessors were overwritten)
    configurations: Tuple[ConfigurationRow, ...] = ()  # multi-GPU rows; `level` is the 1-GPU row's (the Blackwell support RFC)

    def as_json(self) -> Dict[str, Any]:
        return {"schema": PROMOTION_SCHEMA, "release": self.release, "release_sha256": self.release_sha256,
                "target": self.target, "sequence": self.sequence, "previous_sha256": self.previous_sha256,
                "released_level": self.released_level, "level": self.level,
                "consecutive_passes": self.consecutive_passes,
                "required_consecutive_passes": self.required_consecutive_passes, "note": self.note,
                "manifest_sha256": self.manifest_sha256,
                "evidence": [e.as_json(self.target) for e in self.evidence],
                "unsigned_evidence_allowed": self.unsigned_evidence_allowed, "hosts_sha256": self.hosts_sha256,
                "hosts_sequence": self.hosts_sequence, "policy_version": self.policy_version,
                **rows_field(self.configurations)}

    def to_bytes(self) -> bytes:
        return canonical_json(self.as_json())

    @classmethod
    def parse(cls, data: bytes, where: str, error: Type[QualifyError] = VerificationError) -> PromotionRecord:
        f = load(data, where, PROMOTION_SCHEMA, error, legacy=PROMOTION_SCHEMA_V2)
        legacy = f.doc.get("schema") == PROMOTION_SCHEMA_V2
        f.only("schema", "release", "release_sha256", "target", "sequence", "previous_sha256", "released_level",
               "level", "consecutive_passes", "required_consecutive_passes", "note", "manifest_sha256", "evidence",
               "unsigned_evidence_allowed", "hosts_sha256",
               *(() if legacy else ("hosts_sequence", "policy_version", "configurations")))
        target = f.text("target", mf.TARGET_NAME)
        previous = f.optional_text("previous_sha256")
        hosts = f.optional_text("hosts_sha256")
        for name, value in (("previous_sha256", previous), ("hosts_sha256", hosts)):
            if value is not None and not HEX.fullmatch(value):
                raise error(f"{where}: {name!r} is not a sha256")
        sequence = f.integer("sequence", 1)
        if not legacy and (previous is None) != (sequence == 1):
            raise error(f"{where}: promotion {sequence} " + ("names no predecessor" if previous is None else
                                                             "is the first, yet names a predecessor"))
        return cls(
            release=f.text("release"), release_sha256=f.text("release_sha256", HEX), target=target,
            sequence=sequence, previous_sha256=previous, released_level=f.text("released_level"),
            level=f.text("level"), consecutive_passes=f.integer("consecutive_passes"),
            required_consecutive_passes=f.integer("required_consecutive_passes", 1), note=f.text("note", empty=True),
            manifest_sha256=f.text("manifest_sha256", HEX),
            evidence=tuple(CountedEvidence.parse(e, target) for e in f.items("evidence")),
            unsigned_evidence_allowed=f.flag("unsigned_evidence_allowed"), hosts_sha256=hosts,
            hosts_sequence=0 if legacy else f.integer("hosts_sequence"),
            policy_version=0 if legacy else f.integer("policy_version"), legacy=legacy, configurations=rows_of(f))
