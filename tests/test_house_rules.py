"""Issue 40: the house rules are contracts, not conventions. Each rule (tests/house_rules.py) holds on the
package, and fails on a copy of the package with one violation planted (so the check itself can fail); the
call sites of the one verifier are listed, so a new reader of what the release key signs is a visible
change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import house_rules as rules
import pytest
from conftest import REPO

PACKAGE = REPO / "qualify"


@pytest.mark.parametrize("rule", sorted(rules.RULES))
def test_the_house_rule_holds(rule):
    assert rules.RULES[rule](PACKAGE) == []


def _copy(tmp_path: Path) -> Path:
    dest = tmp_path / "qualify"
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


PLANTED = {
    "clients": ("deploy/planted.py", "import shutil\n\nfrom qualify.host import cmd\n\n\ndef engine():\n"
                "    return shutil.which('docker') or cmd.which('podman') or '/usr/bin/docker'\n", 3),
    "nvsmi": ("deploy/planted.py", "FIELDS = 'index,name'\n\n\ndef q(smi):\n    return smi(['--query-gpu=index,name', "
              "f'--query-gpu={FIELDS}', '--format=csv,noheader'])\n\n\ndef mib(v):\n"
              '    """[N/A] in a docstring is fine."""\n    return None if v in ("[N/A]", "[Not Supported]") '
              "else float(v.split()[0])\n", 5),
    # the serve matrix as it was read before issue 52 (the last of two equal keys kept), and two other spellings
    "json": ("probe/planted.py", "import json\nimport json as js\nfrom json import loads\n\n\ndef parse(data, fh):\n"
             "    return json.loads(data.decode()), json.load(fh), loads(data), json.JSONDecoder().decode(data)\n"
             "\n\ndef write(doc):\n    return json.dumps(doc)  # writing JSON is anyone's\n\n\ndef aliased(text):\n"
             "    return js.loads(text)\n", 5),
    "reexport": ("deploy/planted.py", "from qualify.trust.folder import KeyAnchor, read_release\n", 1),
    "subprocess": ("release/planted.py", "import subprocess\n\n\ndef tag():\n    subprocess.run(['git', 'tag'])\n", 1),
    "stderr": ("publish/planted.py", "import sys\n\n\ndef say(m):\n    print(m, file=sys.stderr, flush=True)\n"
               "    sys.stderr.write(m)\n", 2),
    "environment": ("host/planted.py", "import os\n\nSTATE = os.environ.get('QUALIFY_STATE_DIR')\n\n\n"
                    "def f(where=os.getenv('HOME')):\n    return os.environ.get('LATER')  # read when called: fine\n", 2),
    "length": ("deploy/planted.py", "x = 1\n" * (rules.MAX_MODULE_LINES + 1), 1),
    "imageref": ("release/planted.py", "def digest(ref):\n    if '@' in ref:\n        return ref.split('@', 1)[1]\n", 2),
    "python": ("scaleout/planted.py", '"""Docstrings may say 3.11."""\n\nPYTHON = "3.11"\nLOCK = f"py{\'3.12\'}"\n', 2),
    "deploy_targets": ("deploy/planted.py", "from qualify.config import targets\nimport qualify.config.targets\n"
                       "from qualify.config.targets import load\nfrom qualify.config import model\n\n\n"
                       "def target(name):\n    return targets.load().get(name)\n", 3),
    "verifier": ("deploy/planted.py", "from qualify.trust import records as rec\n\n\n"
                 "def index(data):\n    return rec.ReleaseIndex.parse(data, 'release.json')\n", 1),
    # publish as it was before issue 40: the key loaded by hand and DSSE signed with it
    "signer": ("publish/planted.py", "from qualify.signing import formats\n\n\n"
               "def sign(path, password, pae):\n    key = formats.read_key_file(path, password)\n"
               "    return key.sign(pae, ec.ECDSA(hashes.SHA256()))\n", 2),
}


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_a_planted_violation_breaks_the_rule(rule, tmp_path):
    root = _copy(tmp_path)
    rel, text, count = PLANTED[rule]
    (root / rel).write_text(text)
    found = rules.RULES[rule](root)
    assert len(found) == count and all(f.startswith(rel) for f in found), found


def test_every_allowance_names_a_real_place_and_a_reason():
    for allowed in (rules.REEXPORT_ALLOWED, rules.SUBPROCESS_ALLOWED, rules.STDERR_ALLOWED, rules.IMAGEREF_ALLOWED,
                    rules.PYTHON_ALLOWED, rules.PRIVATE_KEY_ALLOWED):
        for where, why in allowed.items():
            assert (PACKAGE / where).exists() and len(why) > 20, (where, why)


# --- the one verifier -------------------------------------------------------------------------------------

# Who reads what the release key signs, and through what (issue 40's acceptance: "a test lists the call
# sites"). trust/verify.py is the verifier; every other reader goes through a source and verify_release.
CALL_SITES = {
    "trust/verify.py": {"signed_bytes", "verify_blob", "check_bundle", "verify_bytes", "ReleaseIndex.parse",
                        "PromotionRecord.parse", "Publication.parse", "EnrolledHosts.parse"},
    # the two sources: a folder (and a journal laid over it), a git tag
    "trust/folder.py": {"verify_release", "verify_hosts", "read_release", "read_hosts_file"},
    "release/history.py": {"verify_release"},  # tags, through one git cat-file --batch; the tag difference too
    # the readers of a release folder, each through read_release (a FolderSource + verify_release)
    "trust/journal.py": {"read_release", "overlay", "verify_hosts", "verify_blob"},  # its recovery checks; the
    # writer's own check of each signature it is about to write
    "release/install.py": {"read_release", "overlay"},  # signature reuse, --force's removals, its own journal
    "release/promote.py": {"read_release", "read_hosts_file"},  # with the accepted evidence (through=evidence)
    "release/verify.py": {"read_release", "verify_blob", "check_bundle"},  # a manifest outside a release: --key
    "publish/publish.py": {"read_release"},
    "release/standing.py": {"read_release"},  # a manifest's current level, for show, diff and report (issue 52)
    "deploy/choice.py": {"read_release", "list_releases"},
    "deploy/signed.py": {"read_release", "list_releases"},  # the release chosen before preflight uses a target fact
    "cli/deploy_cmd.py": {"read_release"},  # deploy seed
    "deploy/servecheck/server.py": {"read_release"},  # the served image against the release's manifest (issue 39)
    "deploy/servecheck/needs.py": {"read_release"},  # the serving checks the release's level requires (issue 48)
    "cli/hosts_cmd.py": {"read_hosts"},
    "trust/hosts.py": {"read_hosts_file"},
    # other anchors, one function each: host-signed evidence (release/evidence.py: signed_by), DSSE payloads
    # from a registry (publish/dsse.py: verify), and `qualify sign` checking the signature it just wrote
    "release/evidence.py": {"verify_blob", "check_bundle"},
    "trust/hostchain.py": {"verify_blob", "check_bundle"},  # who vouched for accepted evidence (host keys)
    "publish/dsse.py": {"verify_bytes"},
    "cli/sign_cmd.py": {"verify_blob"},
}


def test_the_call_sites_of_the_one_verifier():
    found = rules.trust_call_sites(PACKAGE)
    assert found == CALL_SITES, {k: sorted(v) for k, v in found.items() if CALL_SITES.get(k) != v}


def test_verify_release_is_the_only_way_to_a_verified_release():
    """VerifiedRelease is made in trust/verify.py alone (verify_release), never by a caller."""
    import ast

    for rel, _, tree in rules.modules(PACKAGE):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and rules._dotted(node.func).split(".")[-1] == "VerifiedRelease":
                assert rel == rules.VERIFIER, f"{rel}:{node.lineno} makes a VerifiedRelease itself"


# --- the fast lane -------------------------------------------------------------------------------------


def test_tests_that_need_the_engine_are_marked_engine():
    """conftest.py marks every test that uses an engine fixture `engine`, so `-m "not engine"` is a lane that
    needs no container engine (README, Set up): listed here without running them."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "not engine",
                           "tests/test_start_sh.py", "tests/test_trust_chain.py", "tests/test_publish.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]
    kept = [line for line in done.stdout.splitlines() if "::" in line]
    assert not [k for k in kept if k.startswith("tests/test_publish.py")], kept  # all of it needs an engine
    engine_free = {"tests/test_start_sh.py", "tests/test_trust_chain.py"}
    assert {k.split("::")[0] for k in kept} <= engine_free


def test_every_place_the_json_rule_allows_exists():
    """A stale entry (a module renamed, or a pending one merged) would let a new plain json.loads in unseen."""
    for where in rules.JSON_ALLOWED:
        assert (PACKAGE / where).exists(), where
