"""What a release is made of and what it gives back: options, candidates, released and withheld
targets, the steps' results. Typed hand-offs between the release's steps (release.py) and the CLI."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from qualify.core import manifest as mf
from qualify.core.errors import VerificationError
from qualify.core.steps import Step
from qualify.signing import formats
from qualify.trust import records as rec

DEFAULT_MIN_LEVEL = "unverified"
DEFAULT_REMOTE = "origin"


@dataclass(frozen=True)
class ReleaseOptions:
    tag: str
    repo: Path
    source: Path
    out_root: Path
    min_level: str = DEFAULT_MIN_LEVEL
    force: bool = False
    upload: bool = True
    allow_partial: bool = False
    allow_dirty: bool = False
    any_tag: bool = False
    dry_run: bool = False
    push: bool = False
    remote: str = DEFAULT_REMOTE
    targets_file: Optional[Path] = None  # the policy's pass count and fallback intended levels (default: ours)

    @property
    def directory(self) -> Path:
        return self.out_root / self.tag

    @property
    def folder(self) -> str:
        """The release folder relative to the repository (as it is in the release commit)."""
        return self.directory.relative_to(self.repo).as_posix()


@dataclass(frozen=True)
class Candidate:
    """A qualified manifest offered for release: its bytes, read once, and what they say."""

    target: str  # the manifest's own target; the file's name only where the manifest cannot be read
    path: Path
    data: bytes
    manifest: Optional[mf.Manifest] = None
    problem: str = ""  # why the bytes are not a manifest ("" when they are, or were not parsed yet)

    @classmethod
    def of(cls, path: Path, data: bytes) -> Candidate:
        try:
            m = mf.Manifest.parse(data, str(path))
        except VerificationError as exc:
            return cls(path.stem, path, data, None, exc.message)
        return cls(m.target, path, data, m)


@dataclass(frozen=True)
class Withheld:
    target: str
    reason: str


@dataclass(frozen=True)
class ReleasedTarget:
    target: str
    reference: str
    digest: str  # sha256:<hex>, as release.json names it
    manifest_sha256: str
    support_level: str
    verdict: str
    source_revision: str = ""
    capability: str = ""
    platform: str = ""
    profile: str = ""
    intended_level: str = ""  # what the manifest recorded (policy.recorded_intended); "" when it did not

    def entry(self) -> rec.ReleasedEntry:
        """As release.json lists it."""
        return rec.ReleasedEntry(self.target, self.capability, self.platform, self.profile, self.reference,
                                 self.digest, self.manifest_sha256, self.support_level, self.verdict)

    @property
    def manifest_file(self) -> str:
        return f"{self.target}.json"

    @property
    def files(self) -> List[str]:
        return [self.manifest_file, self.manifest_file + formats.SIGNATURE_SUFFIX,
                self.manifest_file + formats.BUNDLE_SUFFIX]


@dataclass
class ReleaseResult:
    tag: str
    directory: str
    released: List[ReleasedTarget] = field(default_factory=list)
    withheld: List[Withheld] = field(default_factory=list)
    written: List[str] = field(default_factory=list)
    unchanged: List[str] = field(default_factory=list)
    left_untouched: List[str] = field(default_factory=list)
    removed: List[str] = field(default_factory=list)
    source_revision: str = ""
    sequence: int = 0
    predecessor: str = ""
    release_commit: str = ""
    tag_object: str = ""
    tag_message: str = ""
    dirty: List[str] = field(default_factory=list)
    push: str = "skipped"
    push_command: List[str] = field(default_factory=list)
    upload: str = "skipped"
    upload_command: List[str] = field(default_factory=list)
    create_command: List[str] = field(default_factory=list)
    dry_run: bool = False
    files: List[str] = field(default_factory=list)
    steps: List[Step] = field(default_factory=list)  # core/steps.py: done or skipped, in order
    recovered: List[str] = field(default_factory=list)  # what an earlier, interrupted run had already done

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)
