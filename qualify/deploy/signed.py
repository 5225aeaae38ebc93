"""The verified release the deploy trusts, chosen before any target fact is used, and the facts it signs.

Issue 52: a deploy host's checkout cannot steer preflight. Which target this host's GPU (or CPU) is, the
driver floor of its CUDA, the memory defaults and reserves, the image user and the `[drivers]` table come only
from the verified release's signed policy (`deploy`, trust/deployfacts.py), never from images/targets.toml.
Preflight finds the host (nvidia-smi, uname) and asks here; the release is read and verified first (choice.py,
trust/folder.py), newest first (RELEASE_TAG's when set), and the first whose signed facts name a target for this
host, and that released it, is the one the trust gate goes on with. A release signed before the deploy facts
existed is refused: nothing vouches for those facts but a targets file anyone can edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from qualify.core import topology
from qualify.core.errors import QualifyError
from qualify.deploy import choice
from qualify.deploy.errors import DeployError, NoReleaseError
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_TRUST, EX_USAGE, Stop, Ui
from qualify.probe.runner import ProbeTarget
from qualify.trust.deployfacts import DeployFacts, DeployTarget
from qualify.trust.folder import list_releases, read_release
from qualify.trust.order import tag_problem
from qualify.trust.verify import KeyAnchor, VerifiedRelease

Match = Callable[[DeployFacts], Optional[DeployTarget]]
RERELEASE = ("re-release with this toolkit (`nox -s release -- TAG`, then promote): it signs the target facts the "
             "deploy needs into release.json's policy")


@dataclass(frozen=True)
class Chosen:
    """The verified release to deploy from, the target of this host in it and all its signed deploy facts."""

    release: VerifiedRelease
    target: DeployTarget
    facts: DeployFacts


def facts_of(release: VerifiedRelease) -> DeployFacts:
    """The release's signed deploy facts; a release without them is refused (never read from a targets file)."""
    policy = release.index.policy
    if policy is None or policy.deploy is None:
        raise DeployError(f"release {release.tag} ({release.path}) was signed before releases carried the deploy "
                          "facts (release.json policy.deploy): the target for this host's GPU, its driver floor, "
                          "memory and user are taken only from a verified release, never from this checkout's "
                          "images/targets.toml", hint=RERELEASE)
    return policy.deploy


class Releases:
    """The releases under MANIFESTS_DIR, verified, as preflight asks for its target."""

    def __init__(self, s: Settings, ui: Ui, fetch: Callable[[str], None]) -> None:
        self.s, self.ui, self.fetch = s, ui, fetch
        self.anchor = KeyAnchor(pinned=s.release_key_fingerprint)
        self._newest: Optional[List[VerifiedRelease]] = None

    def refused(self, exc: QualifyError) -> Stop:
        return Stop.because(EX_TRUST, "trust gate: REFUSED: the release for this host does not verify, or cannot "
                            "be deployed from", exc,
                            "do not deploy from it; restore the release folder (git checkout TAG -- manifests/) or "
                            "fetch the release again; or correct RELEASE_TAG / RELEASE_KEY_FINGERPRINT in "
                            f"{self.s.env_file}",
                            "this refusal cannot be overridden: nothing vouches for what the image is")

    def none_here(self, why: str) -> Stop:
        s = self.s
        extra = ["the registry's attestation alone (IMAGE and RELEASE_PUBLIC_KEY) signs no deploy facts: deploy "
                 "from the release folder (RELEASE_TAG fetches it from the GitHub release)"] \
            if choice.pinned(s.image) and s.release_public_key else []
        return Stop(EX_TRUST, f"trust gate: {why}; the target for this host, its driver floor and memory come only "
                    "from a verified release's signed policy, so nothing can be deployed",
                    f"update this checkout to a release (git pull --tags), or set RELEASE_TAG in {s.env_file} "
                    "(fetched from its GitHub release when absent)", *extra,
                    "--allow-unqualified does not stand in for them")

    def candidates(self) -> List[VerifiedRelease]:
        """RELEASE_TAG's release, or every verified one here, newest first (read once)."""
        if self._newest is not None:
            return self._newest
        manifests, tag = self.s.manifests_dir, self.s.release_tag
        if tag and tag_problem(tag):  # before it names a path
            raise self.refused(DeployError(f"RELEASE_TAG: {tag_problem(tag)}",
                                           hint="set RELEASE_TAG to a release's tag, e.g. v1.2.0"))
        folder = manifests / tag if tag else None
        if folder is not None and not folder.exists() and not folder.is_symlink():
            self.fetch(tag)  # from its GitHub release; verified below as a checked-out one is
            if not folder.exists() and not folder.is_symlink():
                try:
                    known = list_releases(manifests, self.anchor).tags()
                except QualifyError:
                    known = []
                raise self.none_here(f"RELEASE_TAG={tag}: there is no release folder {folder}; releases here: "
                                     f"{', '.join(known) or 'none'}")
        try:
            if folder is not None:
                found = [read_release(folder, self.anchor)]
            else:
                listing = list_releases(manifests, self.anchor)
                if listing.broken:  # never passed over silently: it may be the newest (choice.choose_release)
                    name, why = listing.broken[0]
                    raise DeployError(f"release folder {manifests / name} does not verify: {why}",
                                      hint="restore it from its tag or remove it; or set RELEASE_TAG to the release "
                                      "to deploy")
                found = list(reversed(listing.releases))
        except Stop:
            raise
        except QualifyError as exc:
            raise self.refused(exc) from None
        if not found:
            raise self.none_here(f"no verified release under {manifests}")
        self._newest = found
        return found

    def newest_facts(self) -> DeployFacts:
        """The newest release's facts: what a refusal names as supported."""
        newest = self.candidates()[0]
        try:
            return facts_of(newest)
        except QualifyError as exc:
            raise self.refused(exc) from None

    def find(self, match: Match) -> Optional[Chosen]:
        """The newest release (final, unless RELEASE_TAG names it) whose signed facts `match` a target it
        released; None where none does. A release without the facts met on the way is refused."""
        for release in self.candidates():
            try:
                facts = facts_of(release)
            except QualifyError as exc:
                raise self.refused(exc) from None
            target = match(facts)
            if target is not None and release.has(target.name):
                return self.for_target(target.name)
        return None

    def named(self, name: str) -> Chosen:
        """DEPLOY_TARGET's target, from the newest release that signs it."""
        found = self.find(lambda f: f.get(name))
        if found is None:
            signed = sorted({t.name for t in self.newest_facts().targets})
            raise Stop(EX_USAGE, f"DEPLOY_TARGET={name} in {self.s.env_file} is not a target any verified release "
                       f"here released or signs (the newest signs: {', '.join(signed) or 'none'})",
                       "use one of those, or leave it empty for this host's")
        return found

    def for_target(self, name: str) -> Chosen:
        """The release choice.choose_release makes for `name` (RELEASE_TAG's, else the newest final one that
        has it), with the facts it signs."""
        try:
            release = choice.choose_release(self.s.manifests_dir, name, self.s.release_tag, self.anchor,
                                            fetch=self.fetch, warn=self.ui.warn)
            facts = facts_of(release)
        except NoReleaseError as exc:
            raise self.none_here(str(exc.message)) from None
        except QualifyError as exc:
            raise self.refused(exc) from None
        target = facts.get(name)
        if target is None:  # facts.parse requires each released target: only a pre-release can differ
            raise self.refused(DeployError(f"release {release.tag} signs no deploy facts for {name}", hint=RERELEASE))
        return Chosen(release, target, facts)


def probe_target(chosen: Chosen, profile: Optional[str], tensor_parallel_size: int,
                 allreduce_floors: Sequence[topology.AllReduceFloor], collective_env: dict) -> ProbeTarget:
    """What the probe run on this host is told of the target: the release's signed facts and intended level."""
    t, policy = chosen.target, chosen.release.index.policy
    return ProbeTarget(
        name=t.name, capability=t.capability, platform=t.platform, accelerator=t.accelerator.value,
        torch_cuda_arch_list=t.torch_cuda_arch_list, triton_env=dict(t.triton_env),
        intended_support_level=(policy.intended(t.name) if policy else None) or "experimental", profile=profile,
        unified_memory=t.runtime.unified_memory, gpu_memory_utilization=t.runtime.gpu_memory_utilization,
        min_gpu_memory_gib=t.runtime.min_gpu_memory_gib, tensor_parallel_size=tensor_parallel_size,
        allreduce_floors=tuple(allreduce_floors), collective_env=dict(collective_env or {}))
