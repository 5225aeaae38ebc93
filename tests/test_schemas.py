"""Issue 42: a JSON Schema (draft 2020-12) for every signed record, `manifests/<format>.schema.json`, checked with
check-jsonschema (the CLI a consumer runs) and jsonschema against what `release`, `promote`, `hosts`, `publish` and
`gpu-evidence` really wrote (tests/release_chain.py), and against what the toolkit before issue 37 wrote
(tests/data/legacy-release: promotion/v2, enrolled-hosts/v1). Where the format is ours it is closed: one key we
do not write, anywhere in our objects, is refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import jsonschema
import pytest
from referencing import Registry, Resource

from qualify.core import manifest as mf
from qualify.release import evidence as ev
from qualify.trust import records as rec

pytestmark = [pytest.mark.engine, pytest.mark.slow]
REPO = Path(__file__).resolve().parent.parent
SCHEMAS = REPO / "manifests"
LEGACY = REPO / "tests" / "data" / "legacy-release" / "manifests"
CHECK_JSONSCHEMA = Path(sys.executable).parent / "check-jsonschema"
FORMATS = {  # schema file: the format URI our code writes (or reads, for the older ones)
    "release": rec.RELEASE_SCHEMA, "release-v2": rec.RELEASE_SCHEMA_V2,
    "promotion": rec.PROMOTION_SCHEMA, "promotion-v2": rec.PROMOTION_SCHEMA_V2,
    "publication": rec.PUBLICATION_SCHEMA, "enrolled-hosts": rec.HOSTS_SCHEMA, "enrolled-hosts-v1": rec.HOSTS_SCHEMA_V1,
}


def schema_file(name: str) -> Path:
    return SCHEMAS / f"{name}.schema.json"


def validator(name: str) -> jsonschema.Draft202012Validator:
    """The schema with its relative references (manifest.schema.json#/$defs/check, ...) resolved to the files beside it."""
    resources = [(p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.schema.json")]
    registry = Registry().with_resources(resources).crawl()
    return jsonschema.Draft202012Validator(json.loads(schema_file(name).read_text()), registry=registry)


def check_jsonschema(name: str, *files: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(CHECK_JSONSCHEMA), "--schemafile", str(schema_file(name)), *map(str, files)],
                          capture_output=True, text=True, timeout=300)


def assert_valid(name: str, *files: Path) -> None:
    assert files
    done = check_jsonschema(name, *files)
    assert done.returncode == 0, f"check-jsonschema {name}: {done.stdout}{done.stderr}"
    v = validator(name)
    for f in files:
        errors = list(v.iter_errors(json.loads(f.read_bytes())))
        assert not errors, f"{f}: {[e.message for e in errors[:3]]}"


def records_of(chain) -> dict:
    folder = chain.folder
    evidence = sorted(p for p in (folder / "evidence" / "sm120").glob("*.json") if not p.name.endswith(".sigstore.json"))
    return {"release": [folder / rec.INDEX_FILE],
            "promotion": sorted(p for p in folder.glob("sm120.promotion*.json") if not p.name.endswith(".sigstore.json")),
            "enrolled-hosts": [chain.hosts_file],
            "evidence": evidence,
            "manifest": [folder / "sm120.json"],
            "publication": [folder / rec.PUBLICATION_FILE]}


def test_every_schema_is_a_draft_2020_12_schema_and_names_the_format_the_code_writes():
    names = sorted(p.name[: -len(".schema.json")] for p in SCHEMAS.glob("*.schema.json"))
    assert {*FORMATS, "release-statement", "evidence", "manifest"} <= set(names)
    for name in names:
        done = subprocess.run([str(CHECK_JSONSCHEMA), "--check-metaschema", str(schema_file(name))], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        assert json.loads(schema_file(name).read_text())["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    for name, uri in FORMATS.items():
        assert json.loads(schema_file(name).read_text())["properties"]["schema"] == {"const": uri}, name
    statement = json.loads(schema_file("release-statement").read_text())["properties"]
    assert statement["predicateType"] == {"const": rec.RELEASE_STATEMENT_TYPE}
    assert statement["_type"] == {"const": mf.STATEMENT_TYPE}
    record = json.loads(schema_file("evidence").read_text())["$defs"]["record"]
    assert record["properties"]["schema"] == {"const": ev.SCHEMA}
    assert set(record["properties"]) == set(ev.Evidence.__dataclass_fields__) | {"schema"}


def test_what_release_promote_hosts_and_publish_wrote_validates(release_chain):
    found = records_of(release_chain)
    assert len(found["promotion"]) == 3 and len(found["evidence"]) == 7  # the ledger of three, seven runs kept
    for name, files in found.items():
        assert_valid(name, *files)
    # The hosts file's first version, as git keeps it (the chain's predecessor of the current one).
    first = release_chain.repo / "hosts-1.json"
    first.write_text(release_chain.git("show", "HEAD~1:manifests/hosts.json"))
    assert json.loads(first.read_text())["sequence"] == 1
    assert_valid("enrolled-hosts", first)


def _payloads(chain, monkeypatch) -> List[Tuple[str, bytes]]:
    from qualify.publish import attestation_verify, dsse

    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(chain.registry.auth_file))
    out = []
    for layer, data in attestation_verify.fetch_layers(f"{chain.destination}/sm120", chain.digest):
        out.append((layer.predicate_type, dsse.parse(data).payload))
    return out


def test_the_release_statement_and_qualification_statement_in_the_registry_validate(release_chain, monkeypatch,
                                                                                     tmp_path):
    payloads = _payloads(release_chain, monkeypatch)
    kinds = {rec.RELEASE_STATEMENT_TYPE: "release-statement", mf.PREDICATE_TYPE: "manifest"}
    seen = set()
    for ptype, payload in payloads:
        if ptype in kinds:
            path = tmp_path / f"{kinds[ptype]}.json"
            path.write_bytes(payload)
            assert_valid(kinds[ptype], path)
            seen.add(ptype)
    assert seen == set(kinds)


def test_gpu_evidence_as_qualify_gpu_evidence_writes_it_validates(release_chain, tmp_path):
    """The other form of evidence: the probe manifest `qualify gpu-evidence` writes (here on a host without a GPU,
    so its GPU checks are not-run); a start.sh record is the first form, validated above."""
    chain = release_chain.copy(tmp_path)
    out = chain.gpu_evidence("lab-a", tmp_path / "sm120.probe-evidence.json")
    assert_valid("evidence", out)
    assert_valid("manifest", out)


def test_records_of_the_toolkit_before_the_ledger_validate_against_their_own_schemas():
    folder = LEGACY / "v1.0.0"
    assert_valid("promotion-v2", folder / "sm120.promotion.json")
    assert_valid("enrolled-hosts-v1", LEGACY / rec.HOSTS_FILE)
    assert_valid("release-v2", folder / rec.INDEX_FILE)
    assert_valid("evidence", *sorted(p for p in (folder / "evidence" / "sm120").glob("*.json")
                                     if not p.name.endswith(".sigstore.json")))
    # ...and not against the current ones: a reader tells the versions apart by the schema they name.
    assert check_jsonschema("promotion", folder / "sm120.promotion.json").returncode == 1
    assert check_jsonschema("enrolled-hosts", LEGACY / rec.HOSTS_FILE).returncode == 1
    assert check_jsonschema("release", folder / rec.INDEX_FILE).returncode == 1  # release/v2: promote rewrote manifests


OPEN = ("checks/*/evidence",)  # free-form by design: a check's own evidence


def _objects(doc: Any, path: str = "") -> Iterator[Tuple[str, dict]]:
    if isinstance(doc, dict):
        yield path, doc
        for k, v in doc.items():
            yield from _objects(v, f"{path}/{k}" if path else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _objects(v, f"{path}/{i}" if path else str(i))


def _open(path: str) -> bool:
    import fnmatch

    return any(fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, f"*/{pattern}") for pattern in OPEN)


@pytest.mark.parametrize("name", ["release", "promotion", "enrolled-hosts", "evidence", "publication",
                                  "release-statement"])
def test_one_key_we_do_not_write_is_refused_in_each_of_our_objects(release_chain, name, monkeypatch, tmp_path):
    if name == "release-statement":
        payload = next(p for t, p in _payloads(release_chain, monkeypatch) if t == rec.RELEASE_STATEMENT_TYPE)
        docs = [json.loads(payload)]
    else:
        docs = [json.loads(p.read_bytes()) for p in records_of(release_chain)[name][:2]]
    v = validator(name)
    tried = 0
    for doc in docs:
        assert not list(v.iter_errors(doc))
        for path, obj in _objects(doc):
            # The Statement's envelope and subject are in-toto's (open); so are a check's evidence.
            if _open(path) or (name == "release-statement" and not path.startswith("predicate")):
                continue
            obj["unexpected"] = "x"
            assert list(v.iter_errors(doc)), f"{name}: a key we do not write at {path or '/'} is accepted"
            del obj["unexpected"]
            tried += 1
    # every object of ours the records hold: release.json 9, a promotion record 2 + its runs, a hosts file 3 +
    # a host's key, an evidence record 3 + its checks, published.json 2, a release statement's predicate 1
    assert tried >= {"publication": 2, "release-statement": 1}.get(name, 3), f"{name}: only {tried} objects tried"
