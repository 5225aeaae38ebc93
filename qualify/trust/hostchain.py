"""The enrolled-hosts chain, link by link (issue 49), and who vouched for the evidence a promotion accepted.

`hosts_lineage` walks the chain behind a verified hosts file down to a sequence that was seen: every version
between verified with the release key (verify.verify_hosts_version), each exactly one sequence below its
successor and named by it by sha256; a version not at hand, a link naming no predecessor (a new chain) or a
predecessor of another sequence is refused, naming what to fetch. `hosts_descend` holds a hosts file to each
version a promotion record (or a promoter) saw: another version at that sequence is a fork. The same rule
is VERIFYING.md step 4, which scripts/verify-independent.sh does.

`check_accepted_signatures` is VERIFYING.md step 7's "who vouched": each accepted run signed by the host its
record names, with that host's key in the hosts version the record first accepting it was checked against.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

from qualify.core.errors import VerificationError
from qualify.signing import formats
from qualify.trust.verify import (
    EVIDENCE_DIR,
    HostsVersion,
    TrustedKey,
    VerifiedHosts,
    VerifiedTarget,
    _fail,
    check_bundle,
    sha256,
    verify_blob,
    verify_hosts_version,
)

FETCH_HOSTS = ("fetch it: git fetch (git log -- manifests/hosts.json), or keep it beside hosts.json as "
               "hosts.<sequence>.json with its .sig (qualify hosts keeps each version it replaces), or pass "
               "--hosts-history DIR holding it")


class HostsChainError(VerificationError):
    """The enrolled-hosts chain from a version that was seen to the one offered is cut, forked or restarted."""


def hosts_lineage(current: VerifiedHosts, key: TrustedKey, down_to: int,
                  versions: Callable[[], Sequence[HostsVersion]],
                  verified: Optional[Dict[str, VerifiedHosts]] = None) -> Dict[int, str]:
    """The chain behind `current`, link by link, down to sequence `down_to`: sequence -> sha256, each version
    above `down_to` verified with the release key, each the one its successor names by sha256 and exactly one
    sequence lower (the one at `down_to` is the sha256 its successor names: what was seen there is compared
    with it, its bytes are not needed). A version that is not at hand, a link that names no predecessor
    (`previous_sha256: null`: a new chain) or a predecessor of another sequence is refused (HostsChainError)
    with what to fetch. `versions` is asked only when a link is needed (it may read git's history); the
    versions verified on the way are added to `verified` (by sha256)."""
    chain = {current.hosts.sequence: current.sha256}
    cur, found = current, None
    while cur.hosts.sequence > down_to:
        seq, prev = cur.hosts.sequence, cur.hosts.previous_sha256
        if prev is None:
            raise HostsChainError(
                f"signature check failed: {cur.path}: enrolled-hosts sequence {seq} names no predecessor "
                f"(previous_sha256 null: the first of a new chain), so it does not descend from sequence {down_to}, "
                "which was seen: a new chain would re-enroll whatever it lists",
                hint="restore the chain (git log -- manifests/hosts.json); a chain started over on purpose "
                "(qualify hosts --new-chain) is accepted only where it was made")
        if seq - 1 == down_to:
            chain[down_to] = prev
            break
        if found is None:
            found = {}
            for v in versions():
                found.setdefault(sha256(v.data), v)
        v = found.get(prev)
        if v is None:
            raise HostsChainError(
                f"signature check failed: {cur.path}: enrolled-hosts sequence {seq} names sequence {seq - 1} "
                f"(sha256 {prev[:12]}...), which is not at hand: the chain from sequence {down_to}, which was seen, to "
                f"sequence {current.hosts.sequence} cannot be checked link by link", hint=FETCH_HOSTS)
        vh = verify_hosts_version(v, key)
        if vh.hosts.sequence != seq - 1:
            raise HostsChainError(f"signature check failed: {vh.path}: enrolled-hosts sequence {seq} names it as its "
                                  f"predecessor, but it is sequence {vh.hosts.sequence}, not {seq - 1}",
                                  hint="restore the chain (git log -- manifests/hosts.json)")
        chain[vh.hosts.sequence] = vh.sha256
        if verified is not None:
            verified[vh.sha256] = vh
        cur = vh
    return chain


def hosts_descend(current: VerifiedHosts, key: TrustedKey, seen: Sequence[Tuple[int, str, str]],
                  versions: Callable[[], Sequence[HostsVersion]]) -> Dict[int, str]:
    """Refuse `current` unless every version in `seen` ((sequence, sha256, who saw it)) at or below it is on its
    chain, checked link by link (hosts_lineage); a fork (another version at a sequence seen) is named as one."""
    below = [(s, sha, who) for s, sha, who in seen if 0 < s <= current.hosts.sequence]
    if not below:
        return {current.hosts.sequence: current.sha256}
    chain = hosts_lineage(current, key, min(s for s, _, _ in below), versions)
    for s, sha, who in sorted(below, reverse=True):
        if sha and chain[s] != sha:
            raise HostsChainError(
                f"signature check failed: {current.path}: enrolled-hosts sequence {current.hosts.sequence} does not "
                f"descend from sequence {s} (sha256 {sha[:12]}...), which {who} saw: its chain leads through another "
                f"sequence {s} (sha256 {chain[s][:12]}...), a fork of the chain (a removed host re-enrolled by a "
                "second admin's versions?)",
                hint="restore the newest manifests/hosts.json of the chain that was seen, and make each change "
                "from it (qualify hosts add|remove)")
    return chain


def check_accepted_signatures(folder: str, vt: VerifiedTarget,
                              hosts_at: Callable[[str, int], Optional[VerifiedHosts]]) -> List[str]:
    """Each run `vt`'s ledger accepted is signed by the host its record names, with the key that host had in
    the hosts version the record that first accepted it was checked against (`hosts_at(sha256, sequence)`: that
    version, verified, or None when it is not at hand); the serve-check record it counted with, by the same
    host (a record from another host never completes a GPU run: the GPU host signs its own matrix). `unsigned`
    only where that record says it was allowed. Keyless hosts need cosign: returned, never passed silently."""
    unchecked = []
    for a in vt.accepted:
        record = a.first or vt.promotion
        where = f"{folder}/{EVIDENCE_DIR}/{vt.target}/{a.sha256}.json"
        if record is None:
            continue
        if a.host == "unsigned":
            if not record.unsigned_evidence_allowed:
                raise _fail(where, "counted as unsigned evidence, but the promotion record that accepted it does "
                            "not say unsigned evidence was allowed")
            continue
        if not record.hosts_sha256:
            raise _fail(where, f"the promotion record says {a.host} signed it, but names no enrolled-hosts file")
        version = hosts_at(record.hosts_sha256, record.hosts_sequence)
        if version is None:
            raise HostsChainError(f"signature check failed: {where}: signed by {a.host}, enrolled in hosts.json "
                                  f"sha256 {record.hosts_sha256[:12]}... (sequence {record.hosts_sequence}), which "
                                  "is not at hand", hint=FETCH_HOSTS)
        host = version.hosts.host(a.host)
        if host is None:
            raise _fail(where, f"counted from {a.host}, who is not enrolled in the hosts version (sequence "
                        f"{version.hosts.sequence}) the promotion record that accepted it was checked against")
        if host.keyless:
            unchecked.append(f"{where}: signed keylessly by {a.host} ({host.identity}): needs cosign verify-blob")
            continue
        key = TrustedKey.from_bytes(host.key_pem.encode("utf-8"), f"{a.host}'s enrolled key")
        if key.fingerprint != host.fingerprint:
            raise _fail(str(version.path), f"{a.host}'s key is {key.fingerprint}, not its enrolled fingerprint "
                        f"{host.fingerprint}")
        for data, sig, bundle, what in ((a.data, a.signature, a.bundle, where),
                                        (a.serving_data, a.serving_signature, a.serving_bundle,
                                         f"{folder}/{EVIDENCE_DIR}/{vt.target}/{a.serving_sha256}.json")):
            if data is None:
                continue
            if sig is None and bundle is None:
                if record.unsigned_evidence_allowed and what != where:
                    continue
                raise _fail(what, f"the promotion record says {a.host} signed it, but no .sig or .sigstore.json is "
                            "kept beside it")
            try:
                if sig is not None:
                    verify_blob(key, data, sig, bundle, f"{what} (host {a.host})")
                else:
                    check_bundle(key, data, bundle, f"{what}{formats.BUNDLE_SUFFIX} (host {a.host})")
            except VerificationError as exc:
                cause = exc.message.removeprefix("signature check failed: ")
                raise _fail(what, f"not signed by {a.host}, the host the promotion record names"
                            + (" for the GPU run it completes" if what != where else "") + f": {cause}") from None
    return unchecked
