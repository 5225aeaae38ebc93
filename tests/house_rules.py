"""The house rules (BRIEF.md, ARCHITECTURE.md "House rules"), as checks over a package's sources.

Each check reads the package at `root` (the real one, or a copy with a violation planted by
tests/test_house_rules.py) with `ast`, and returns one line per violation, `path:line: what`; [] when the
rule holds. Comments never count (they are not in the tree); docstrings are skipped where a rule is about
code (a docstring may name a Python version or an image reference as an example).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

MAX_MODULE_LINES = 600

# Who may start processes without qualify/host/cmd.py, and why.
SUBPROCESS_ALLOWED: Dict[str, str] = {
    "host/cmd.py": "the runner itself: every other host-side process goes through it",
    "core/": "image side: runs inside images with the standard library only, and cannot import host/",
    "probe/": "image side: runs inside images with the standard library only, and cannot import host/",
    "devtools/": "developers' benchmarks and interop checks; nothing imports them",
    "toolenv.py": "makes the toolkit's venv before any dependency (or host/) can be imported",
}
# Who may write to stderr: the Reporter (core/report.py), which escapes control characters.
STDERR_ALLOWED: Dict[str, str] = {
    "core/report.py": "the Reporter and `emit`, the one writer of stderr",
    "toolenv.py": "runs before the package's dependencies exist and imports nothing of it",
}
# Who may take an image reference apart by hand.
IMAGEREF_ALLOWED: Dict[str, str] = {
    "config/imageref.py": "ImageRef itself, the one parser of image references",
    "core/": "image side: cannot import config/ (the host hands it references ImageRef made)",
    "probe/": "image side: cannot import config/ (the host hands it references ImageRef made)",
}
# Who may spell a Python version.
PYTHON_ALLOWED: Dict[str, str] = {
    "config/targets.py": "the reader of images/targets.toml, where every Python version is written",
}
PYTHON_VERSION = re.compile(r"(?<![\w.])3\.1[0-9](?![\w.]*\d)")
_PROCESS_CALLS = {("os", n) for n in ("system", "popen", "execv", "execve", "execvp", "execvpe", "execl", "execle",
                                       "execlp", "execlpe", "spawnv", "spawnve", "spawnl", "spawnle", "posix_spawn",
                                       "posix_spawnp")} | {("asyncio", "create_subprocess_exec"),
                                                           ("asyncio", "create_subprocess_shell"), ("pty", "spawn")}


def modules(root: Path) -> Iterator[Tuple[str, Path, ast.Module]]:
    """(path relative to the package, path, tree) of every module of the package at `root`."""
    for path in sorted(Path(root).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        rel = path.relative_to(root).as_posix()
        yield rel, path, ast.parse(path.read_text(), str(path))


def _allowed(rel: str, allowed: Dict[str, str]) -> bool:
    return any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed)


def _docstrings(tree: ast.Module) -> set:
    """The ids of every docstring's Constant node (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def subprocess_outside_runner(root: Path) -> List[str]:
    out = []
    for rel, _, tree in modules(root):
        if _allowed(rel, SUBPROCESS_ALLOWED):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "subprocess" for a in node.names):
                out.append(f"{rel}:{node.lineno}: imports subprocess (run it through qualify/host/cmd.py)")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "subprocess":
                out.append(f"{rel}:{node.lineno}: imports from subprocess (run it through qualify/host/cmd.py)")
            elif isinstance(node, ast.Call) and tuple(_dotted(node.func).split(".")[-2:]) in _PROCESS_CALLS:
                out.append(f"{rel}:{node.lineno}: {_dotted(node.func)}() starts a process outside qualify/host/cmd.py")
    return out


def _is_stderr(node: ast.AST) -> bool:
    return _dotted(node) in ("sys.stderr", "sys.__stderr__", "stderr")


def stderr_outside_reporter(root: Path) -> List[str]:
    out = []
    for rel, _, tree in modules(root):
        if _allowed(rel, STDERR_ALLOWED):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _dotted(node.func)
            if name == "print" and any(k.arg == "file" and _is_stderr(k.value) for k in node.keywords):
                out.append(f"{rel}:{node.lineno}: print(..., file=sys.stderr) outside the Reporter (core/report.py)")
            elif name.endswith(".write") and _is_stderr(node.func.value):  # sys.stderr.write(...)
                out.append(f"{rel}:{node.lineno}: {name}() outside the Reporter (core/report.py)")
    return out


def _environment_reads(node: ast.AST) -> Iterator[ast.AST]:
    for sub in ast.walk(node):
        name = _dotted(sub) if isinstance(sub, (ast.Attribute, ast.Name)) else ""
        if name in ("os.environ", "os.environb", "os.getenv", "os.getenvb", "environ", "getenv"):
            yield sub


def environment_at_import(root: Path) -> List[str]:
    """Environment reads that run when the module is imported: module and class bodies, decorators and
    default values (function bodies and lambdas run later, when called)."""
    out: List[str] = []
    for rel, _, tree in modules(root):
        _visit(tree.body, "module level", rel, out)
    return out


def _visit(body, where: str, rel: str, out: List[str]) -> None:
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for part in [*stmt.decorator_list, *stmt.args.defaults, *stmt.args.kw_defaults]:
                for hit in _environment_reads(part) if part is not None else ():
                    out.append(f"{rel}:{hit.lineno}: reads the environment at import time ({where})")
            continue
        if isinstance(stmt, ast.ClassDef):
            for part in stmt.decorator_list:
                for hit in _environment_reads(part):
                    out.append(f"{rel}:{hit.lineno}: reads the environment at import time ({where})")
            _visit(stmt.body, f"class {stmt.name}", rel, out)
            continue
        for hit in _environment_reads(_without_lambdas(stmt)):
            out.append(f"{rel}:{hit.lineno}: reads the environment at import time ({where}); read it where it is used")


def _without_lambdas(stmt: ast.AST) -> ast.AST:
    """The statement with the bodies of lambdas and nested definitions cut out (they run later)."""
    class Cut(ast.NodeTransformer):
        def visit_Lambda(self, node):
            return ast.Constant(None)

        def visit_FunctionDef(self, node):
            return None

        visit_AsyncFunctionDef = visit_FunctionDef

    import copy

    return Cut().visit(copy.deepcopy(stmt))


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> List[str]:
    out = []
    for path in sorted(Path(root).rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        lines = len(path.read_text().splitlines())
        if lines > limit:
            out.append(f"{path.relative_to(root).as_posix()}: {lines} lines (at most {limit}): split it")
    return out


def image_references_by_hand(root: Path) -> List[str]:
    """`x.split("@")`, `partition("@")`, `"@" in x`, `x.index("@")`, `endswith("@" + ...)`: an image reference
    taken apart beside ImageRef (config/imageref.py)."""
    out = []
    for rel, _, tree in modules(root):
        if _allowed(rel, IMAGEREF_ALLOWED):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "split", "rsplit", "partition", "rpartition", "index", "find", "rfind", "endswith", "startswith"):
                first = node.args[0] if node.args else None
                if _has_at(first):
                    out.append(f"{rel}:{node.lineno}: .{node.func.attr}('@'...) on an image reference: use ImageRef")
            elif isinstance(node, ast.Compare) and _has_at(node.left) \
                    and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                out.append(f"{rel}:{node.lineno}: '@' in ... on an image reference: use ImageRef")
    return out


def _has_at(node) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith("@")
    if isinstance(node, ast.BinOp):  # "@" + digest
        return _has_at(node.left)
    return False


def python_versions(root: Path) -> List[str]:
    """A Python version ("3.11") spelled in code: it belongs in images/targets.toml, read by config/targets.py."""
    out = []
    for rel, _, tree in modules(root):
        if _allowed(rel, PYTHON_ALLOWED):
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs \
                    and PYTHON_VERSION.search(node.value):
                out.append(f"{rel}:{node.lineno}: Python version in {node.value[:60]!r}: take it from the targets "
                           "file (config/targets.py)")
    return out


# --- the one verifier (issue 40) -------------------------------------------------------------------

SIGNED_RECORDS = ("ReleaseIndex", "PromotionRecord", "Publication", "EnrolledHosts")
VERIFIER = "trust/verify.py"
# Who calls what of the trust layer's reading side, by module: the test lists these call sites, so a new
# reader of release.json (or of the records signed with the release key) shows up as a change here.
TRUST_ENTRY_POINTS = ("verify_release", "verify_hosts", "signed_bytes", "read_release", "list_releases",
                      "read_hosts_file", "read_hosts", "overlay", "verify_blob", "check_bundle", "verify_bytes")


def trust_call_sites(root: Path) -> Dict[str, set]:
    """module -> the trust entry points it calls and the signed record types it parses (`X.parse`)."""
    out: Dict[str, set] = {}
    for rel, _, tree in modules(root):
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in TRUST_ENTRY_POINTS:
                out.setdefault(rel, set()).add(name)
            elif name == "parse" and isinstance(f, ast.Attribute) and _dotted(f.value).split(".")[-1] in SIGNED_RECORDS:
                out.setdefault(rel, set()).add(_dotted(f.value).split(".")[-1] + ".parse")
    return out


def signed_records_outside_verifier(root: Path) -> List[str]:
    """A record signed with the release key parsed, or a release-key signature checked (`signed_bytes`,
    `formats.verify_bytes`), anywhere but the one verifier: bytes that were never verified taken as true.
    DSSE payloads (publish/dsse.py) have their own anchor and their own one function."""
    out = []
    for rel, found in sorted(trust_call_sites(root).items()):
        if rel == VERIFIER:
            continue
        for what in sorted(found):
            if what.endswith(".parse") or what == "signed_bytes" or (what == "verify_bytes" and rel != "publish/dsse.py"):
                out.append(f"{rel}: {what} outside {VERIFIER}: read it through verify_release / verify_hosts")
    return out


# --- the one signer interface (issue 40) ---------------------------------------------------------------

# Who may hold a private key: signing/ (the Signer implementations), and, with reasons, the places that
# cannot or need not go through one.
PRIVATE_KEY_ALLOWED: Dict[str, str] = {
    "signing/": "the Signer protocol and its implementations (built-in, cosign): the one place keys are opened",
    "probe/": "image side: signs the probe's record inside the image, where signing/ is not staged",
    "devtools/": "interop checks that make keys of their own to compare our formats with cosign and sigstore-js",
}
_PRIVATE_KEY_NAMES = {"private_key", "load_private_key", "read_key_file", "load_pem_private_key",
                      "load_der_private_key", "ECDSA", "decrypt_private_key"}


def private_keys_outside_signer(root: Path) -> List[str]:
    """A private key opened, held or used outside signing/: a stage that signs takes a Signer (signing/signer.py:
    sign_blob, sign_dsse, public_key), so a cosign, KMS or keyless signer can sign everything it writes."""
    out = []
    for rel, _, tree in modules(root):
        if _allowed(rel, PRIVATE_KEY_ALLOWED):
            continue
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
            if name in _PRIVATE_KEY_NAMES:
                out.append(f"{rel}:{node.lineno}: {name} outside signing/: sign through a Signer (signing/signer.py)")
    return out


# A name is imported from the module that makes it, so `grep "from qualify.trust.verify import"` finds every
# user of the verifier's types. Facades that re-export on purpose, each with why:
REEXPORT_ALLOWED = {
    "config/targets.py": "the one reader of images/targets.toml: its model types (config/model.py) come with it",
    "probe/providers/__init__.py": "the providers package's face: one module per idea behind one import",
}


def _module_names(root: Path) -> Dict[str, Tuple[set, set]]:
    """qualify.<module> -> (names it makes at top level, names it imports with `from ... import`)."""
    out = {}
    for rel, _, tree in modules(root):
        made, brought = set(), set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                made.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    made |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.ImportFrom):
                brought |= {a.asname or a.name for a in node.names}
        name = "qualify." + rel[:-3].replace("/", ".")
        out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = (made, brought)
    return out


def names_taken_second_hand(root: Path) -> List[str]:
    names = _module_names(root)
    out = []
    for rel, _, tree in modules(root):
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module in names):
                continue
            made, brought = names[node.module]
            source = node.module[len("qualify."):].replace(".", "/")
            if f"{source}.py" in REEXPORT_ALLOWED or f"{source}/__init__.py" in REEXPORT_ALLOWED:
                continue
            for a in node.names:
                if a.name not in made and a.name in brought:
                    out.append(f"{rel}:{node.lineno}: {a.name} taken from {node.module}, which imports it: "
                               "import it from where it is made")
    return out


# --- one nvidia-smi query (issue 52) ---------------------------------------------------------------------

NVSMI = "core/nvsmi.py"


_NVSMI_ARGS = ("--query-gpu", "--format=csv")
_NVSMI_MARKS = ("[N/A]", "[Not Supported]")


def nvidia_smi_queries_by_hand(root: Path) -> List[str]:
    """nvidia-smi's query output read outside core/nvsmi.py: a `--query-gpu=...` or `--format=csv...` argument
    (a second list of fields, and so a second parser of its CSV: there were two, reading different fields), or
    its "[N/A]" / "[Not Supported]" marks tested in code (a second reader of its values: the memory field was
    parsed twice). Docstrings may name them."""
    out = []
    for rel, _, tree in modules(root):
        if rel == NVSMI:
            continue
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            # An f-string's literal head is a Constant too, so this one test sees both spellings.
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)) or id(node) in docs:
                continue
            if node.value.startswith(_NVSMI_ARGS):
                out.append(f"{rel}:{node.lineno}: nvidia-smi queried by hand: use {NVSMI} (query_args, parse)")
            elif any(mark in node.value for mark in _NVSMI_MARKS):
                out.append(f"{rel}:{node.lineno}: nvidia-smi's values read by hand: use {NVSMI} (not_available, mib)")
    return out


CLIENTS = "host/clients.py"
_ENGINE_PROGRAMS = {"docker", "podman", "docker-compose", "podman-compose", "docker-registry"}


def engine_clients_found_by_hand(root: Path) -> List[str]:
    """A container engine's program looked up (`which("docker")`, ...) or named by its Debian path outside
    host/clients.py: a second rule for which client runs (there were three)."""
    out = []
    for rel, _, tree in modules(root):
        if rel == CLIENTS:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "which" and node.args
                    and isinstance(node.args[0], ast.Constant) and node.args[0].value in _ENGINE_PROGRAMS):
                out.append(f"{rel}:{node.lineno}: {node.args[0].value} found by hand: use {CLIENTS}")
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value.startswith("/usr/bin/") and node.value[len("/usr/bin/"):] in _ENGINE_PROGRAMS):
                out.append(f"{rel}:{node.lineno}: {node.value} named by hand: use {CLIENTS}")
    return out


# --- one JSON reader (issue 52) ---------------------------------------------------------------------------

JSON_READER = "core/readlimit.py"
# Who may decode JSON without core/readlimit.py's strict_json (duplicate keys refused, nesting and numbers
# bounded, an error naming the document), and why.
JSON_ALLOWED: Dict[str, str] = {
    JSON_READER: "strict_json and read_json themselves: the one reader",
    "probe/snippets/": "scripts the probe runs by path in a child interpreter (torch, vLLM): they import nothing "
                       "of the toolkit, and read only the JSON argument the probe wrote for them",
    "devtools/": "developers' benchmarks and interop checks; nothing imports them",
}
_JSON_DECODERS = {"load", "loads", "JSONDecoder", "raw_decode", "decoder"}


def json_outside_reader(root: Path) -> List[str]:
    """JSON decoded outside core/readlimit.py: `json.load(s)`, `json.JSONDecoder`, `from json import loads`. Such
    a read keeps the last of two equal keys without a word (the serve matrix was read so), and its error names
    no file; decode through strict_json (bytes or text) or read_json (a file)."""
    out = []
    for rel, _, tree in modules(root):
        if _allowed(rel, JSON_ALLOWED):
            continue
        # `import json as j` binds the module under another name: j.loads is json.loads
        names = {"json"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                            for a in n.names if a.name == "json" and a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "json":
                for a in node.names:
                    if a.name in _JSON_DECODERS or node.module != "json":
                        out.append(f"{rel}:{node.lineno}: imports {a.name} from {node.module}: decode JSON with "
                                   f"{JSON_READER} (strict_json, read_json)")
            elif isinstance(node, ast.Attribute) and node.attr in _JSON_DECODERS and _dotted(node.value) in names:
                out.append(f"{rel}:{node.lineno}: json.{node.attr} outside the one reader: use {JSON_READER} "
                           "(strict_json, read_json)")
    return out


# --- the deploy reads no targets file (issue 52) --------------------------------------------------------


def deploy_reads_targets_file(root: Path) -> List[str]:
    """A module under deploy/ importing qualify.config.targets: the deploy's target facts (the GPU's target,
    driver floor, memory, user) come from the verified release's signed policy (deploy/signed.py), so that a
    deploy host's checkout cannot steer preflight."""
    out = []
    for rel, _, tree in modules(root):
        if not rel.startswith("deploy/"):
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            if any(n == "qualify.config.targets" or n.startswith("qualify.config.targets.") for n in names):
                out.append(f"{rel}:{node.lineno}: imports qualify.config.targets: take the target's facts from the "
                           "verified release's signed policy (deploy/signed.py)")
    return out


RULES = {
    "deploy_targets": deploy_reads_targets_file,
    "clients": engine_clients_found_by_hand,
    "nvsmi": nvidia_smi_queries_by_hand,
    "json": json_outside_reader,
    "reexport": names_taken_second_hand,
    "subprocess": subprocess_outside_runner,
    "stderr": stderr_outside_reporter,
    "environment": environment_at_import,
    "length": long_modules,
    "imageref": image_references_by_hand,
    "python": python_versions,
    "verifier": signed_records_outside_verifier,
    "signer": private_keys_outside_signer,
}
