"""`python -m qualify hosts add|remove|list`: the hosts whose signed GPU evidence `promote` counts.

The list is manifests/hosts.json, signed with the release key (so whoever can write a release folder
cannot enroll themselves); commit it, and every release commit carries it.
"""

from __future__ import annotations

import json
from pathlib import Path

from qualify.core.errors import ConfigError
from qualify.host import paths
from qualify.release import folder
from qualify.release import records as rec


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
    add = sub.choices["add"]
    add.add_argument("--key", type=Path, help="the host's public key (its cosign.pub)")
    add.add_argument("--identity", help="keyless: the certificate identity (e.g. the release workflow)")
    add.add_argument("--issuer", help="keyless: the OIDC issuer (e.g. https://token.actions.githubusercontent.com)")


def _current(path: Path, key: folder.TrustedKey) -> rec.EnrolledHosts:
    return folder.read_hosts(path, key) if path.exists() else rec.EnrolledHosts(0, ())


def _host(args) -> rec.EnrolledHost:
    if not rec.HOST_NAME.fullmatch(args.name):
        raise ConfigError(f"{args.name!r} is not a host name (lower-case letters, digits, '.', '_', '-')")
    if bool(args.key) == bool(args.identity and args.issuer):
        raise ConfigError("give the host's --key HOST.pub, or a keyless --identity ID with --issuer URL")
    if args.key:
        key = folder.TrustedKey.read(args.key)
        return rec.EnrolledHost(args.name, key_pem=key.pem.decode("ascii"), fingerprint=key.fingerprint)
    return rec.EnrolledHost(args.name, identity=args.identity, issuer=args.issuer)


def execute(args) -> int:
    if args.action == "list":
        hosts = folder.read_hosts(args.file, folder.TrustedKey.read(args.key))
        if args.json:
            print(json.dumps(hosts.as_json(), indent=2, sort_keys=True))
        for h in hosts.hosts:
            print(f"{h.name}: " + (f"keyless {h.identity} from {h.issuer}" if h.keyless else f"key {h.fingerprint}"))
        return 0
    from qualify.release.promote import release_signer

    sign, key = release_signer(args.release_key)
    hosts = _current(args.file, key)
    others = tuple(h for h in hosts.hosts if h.name != args.name)
    if args.action == "remove" and len(others) == len(hosts.hosts):
        raise ConfigError(f"{args.name} is not enrolled in {args.file}")
    new = rec.EnrolledHosts(hosts.sequence + 1, others + ((_host(args),) if args.action == "add" else ()))
    folder.write_hosts(args.file, new, sign, key)
    print(f"{args.file}: {len(new.hosts)} enrolled host(s), sequence {new.sequence}, signed with {key.fingerprint}; "
          f"commit it (git add {args.file}*)")
    return 0
