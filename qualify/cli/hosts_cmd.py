"""`python -m qualify hosts add|remove|list`: the hosts whose signed GPU evidence `promote` counts.

The list is manifests/hosts.json, signed with the release key (so whoever can write a release folder
cannot enroll themselves); commit it, and every release commit carries it. Each change is the next version
of a chain (release/hosts.py): a lost file is restored, or replaced on purpose with --new-chain.
"""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core.errors import ConfigError, printable
from qualify.host import paths
from qualify.trust import folder
from qualify.trust import hosts as chain
from qualify.trust import records as rec
from qualify.trust.verify import TrustedKey


def configure_parser(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    for name, text in (("add", "enroll a host: its public key, or a keyless identity (a CI job)"),
                       ("remove", "withdraw a host's enrollment"), ("list", "show the enrolled hosts")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--file", type=Path, default=paths.HERE.hosts_file)
        if name != "list":
            p.add_argument("name", help="the host's name, as promotion records will name it")
            p.add_argument("--release-key", type=Path, default=Path("cosign.key"),
                           help="the release's private key (password from COSIGN_PASSWORD or the terminal)")
        else:
            p.add_argument("--key", type=Path, default=Path("cosign.pub"), help="the release's public key")
            p.add_argument("--json", action="store_true")
    for name in ("add", "remove"):
        sub.choices[name].add_argument("--new-chain", action="store_true",
                                       help="the hosts file is lost: start a new chain (above every sequence this "
                                       "host saw); hosts enrolled before must be enrolled again")
    add = sub.choices["add"]
    add.add_argument("--replace", action="store_true", help="replace the key of a host already enrolled")
    add.add_argument("--key", type=Path, help="the host's public key (its cosign.pub)")
    add.add_argument("--identity", help="keyless: the certificate identity (e.g. the release workflow)")
    add.add_argument("--issuer", help="keyless: the OIDC issuer (e.g. https://token.actions.githubusercontent.com)")


def _host(args) -> rec.EnrolledHost:
    if not rec.HOST_NAME.fullmatch(args.name):
        raise ConfigError(f"{args.name!r} is not a host name (lower-case letters, digits, '.', '_', '-')")
    if bool(args.key) == bool(args.identity and args.issuer):
        raise ConfigError("give the host's --key HOST.pub, or a keyless --identity ID with --issuer URL")
    if args.key:
        key = TrustedKey.read(args.key)
        return rec.EnrolledHost(args.name, key_pem=key.pem.decode("ascii"), fingerprint=key.fingerprint)
    return rec.EnrolledHost(args.name, identity=args.identity, issuer=args.issuer)


def execute(args) -> int:
    if args.action == "list":
        hosts = folder.read_hosts(args.file, TrustedKey.read(args.key))
        if args.json:
            print(json.dumps(hosts.as_json(), indent=2, sort_keys=True))
            return 0
        print(f"{args.file}: sequence {hosts.sequence}" + (" (a chain's first)" if hosts.previous_sha256 is None
                                                            else f", after sha256 {hosts.previous_sha256[:12]}..."))
        for h in hosts.hosts:
            print(printable(f"{h.name}: " + (f"keyless {h.identity} from {h.issuer}" if h.keyless
                                             else f"key {h.fingerprint}")))
        return 0
    from qualify.release.promote import release_signer

    release, key = release_signer(args.release_key)
    recovered = chain.recover(args.file, key)  # said first: the change below may still fail
    for note in recovered:
        print(printable(note))
    done = chain.change(args.file, release, key, add=_host(args) if args.action == "add" else None,
                        remove=args.name if args.action == "remove" else "", new_chain=args.new_chain,
                        replace=getattr(args, "replace", False), recovered=chain.finished_a_write(recovered))
    for note in done.notes:
        print(printable(note))
    if done.written:
        kept = args.file.with_name(folder.kept_hosts_name(args.file.name, done.hosts.sequence - 1))
        also = f" {kept}*" if done.hosts.previous_sha256 and kept.exists() else ""
        print(f"{args.file}: {len(done.hosts.hosts)} enrolled host(s), sequence {done.hosts.sequence}, signed with "
              f"{key.fingerprint}; commit it (git add {args.file}*{also})")
    return 0
