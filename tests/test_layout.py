"""The package layout keeps its promises: the image side stands alone, stages do not import each other
in cycles, and the probe's identity depends on the image side only."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from qualify.qualification import container

PACKAGE = REPO / "qualify"
IMAGE_SIDE_DIRS = ("core", "probe")
# What the image side may import besides the standard library and itself.
# zstandard, lz4 and cryptography are staged beside the probe for the image's interpreter (probe/staged.py) and
# imported only where present; pyelftools is staged with the probe itself.
IMAGE_SIDE_THIRD_PARTY = {"elftools", "zstandard", "lz4", "cryptography", "nacl"}


def _modules(folder: Path):
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


# What an image's own python3 (3.9+) runs: the image side, every package's __init__.py and __main__.py (the
# package root is staged with it), and `qualify inspect`, which runs on such an interpreter too.
PY39_SOURCES = sorted({*(p for d in IMAGE_SIDE_DIRS for p in _modules(PACKAGE / d)),
                       *(p for p in _modules(PACKAGE) if p.name in ("__init__.py", "__main__.py")),
                       PACKAGE / "cli" / "inspect_cmd.py", PACKAGE / "cli" / "simple_args.py"})


@pytest.mark.parametrize("path", PY39_SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_image_side_sources_parse_as_python_3_9(path):
    ast.parse(path.read_text(), filename=str(path), feature_version=(3, 9))


def _imports(path: Path):
    """(module imported, line) for every import in the file, relative ones resolved."""
    rel = path.relative_to(REPO).with_suffix("")
    package = list(rel.parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, node.lineno
            for alias in node.names:  # `from qualify import x` imports the module qualify.x
                yield f"{mod}.{alias.name}", node.lineno


def _image_side_files():
    return [p for d in IMAGE_SIDE_DIRS for p in _modules(PACKAGE / d)
            if "snippets" not in p.relative_to(PACKAGE).parts]  # snippets run in child interpreters


@pytest.mark.parametrize("path", _image_side_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_image_side_imports_nothing_from_the_host_side(path):
    stdlib = set(sys.stdlib_module_names)
    for mod, line in _imports(path):
        top = mod.split(".")[0]
        if top == "qualify":
            parts = mod.split(".")
            if len(parts) == 1 or parts[1] == "__version__":
                continue
            assert parts[1] in IMAGE_SIDE_DIRS, f"{path.relative_to(REPO)}:{line} imports host-side {mod}"
        elif top not in stdlib and top != "__future__":
            assert top in IMAGE_SIDE_THIRD_PARTY, f"{path.relative_to(REPO)}:{line} imports {mod} (not stdlib)"


def test_no_import_cycle_between_modules():
    graph = {}
    names = {}
    for path in _modules(PACKAGE):
        rel = path.relative_to(REPO).with_suffix("")
        mod = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        names[mod] = path
    for mod, path in names.items():
        # function-level imports count too: a late import only hides a cycle
        graph[mod] = {dep for dep, _ in _imports(path) if dep in names and dep != mod}
    state = {}

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])


def _copy_package(tmp_path: Path) -> Path:
    dest = tmp_path / "qualify"
    shutil.copytree(PACKAGE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_editing_host_side_code_keeps_the_probe_identity(tmp_path):
    root = _copy_package(tmp_path)
    before = container.probe_sources_digest(root)
    assert before == container.probe_sources_digest(PACKAGE)
    for host_module in ("release/release.py", "deploy/run.py", "host/engine.py", "cli/__init__.py"):
        with open(root / host_module, "a") as fh:
            fh.write("\n# an edit on the host side\n")
    assert container.probe_sources_digest(root) == before


@pytest.mark.parametrize("image_module", ["core/arch.py", "probe/runner.py", "__init__.py"])
def test_editing_image_side_code_changes_the_probe_identity(tmp_path, image_module):
    root = _copy_package(tmp_path)
    before = container.probe_sources_digest(root)
    with open(root / image_module, "a") as fh:
        fh.write("\n# an edit on the image side\n")
    assert container.probe_sources_digest(root) != before


def test_stage_folders_read_as_the_data_flow():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == sorted(["core", "probe", "config", "host", "imagebuild", "repro", "qualification", "signing",
                              "trust", "release", "deploy", "devtools", "cli", "publish", "scaleout", "tinymodel"])


def test_the_host_probe_needs_no_host_only_dependency():
    """scripts/gpu-evidence.sh runs `python -m qualify probe --target ...` on GPU hosts that have torch and
    pyelftools but not python-on-whales, cryptography or jsonschema."""
    import subprocess

    code = ("import sys, json\n"
            "for name in ('python_on_whales', 'cryptography', 'jsonschema', 'tomlkit', 'nacl'):\n"
            "    sys.modules[name] = None  # importing any of them now fails\n"
            "from qualify.cli import probe_cmd\n"
            "from qualify.config import targets\n"
            "from qualify.qualification.container import probe_target\n"
            "print(json.dumps(probe_target(targets.load().get('sm120'), 'smoke').name))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == '"sm120"', out.stderr


def _lint_imports(root: Path):
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.fail("import-linter is not installed: pip install -e '.[test]' (the README's test set-up)")
    return subprocess.run([str(lint), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)})


def test_the_stage_graph_holds():
    """Issue 28: the layers of ARCHITECTURE.md (pyproject.toml's import-linter contract), late imports included."""
    out = _lint_imports(REPO)
    assert out.returncode == 0 and "1 kept, 0 broken" in out.stdout, out.stdout[-3000:] + out.stderr[-2000:]


def test_an_upward_import_breaks_the_stage_graph(tmp_path):
    """The contract can fail: a copy of the package where the census imports the CLI, inside a function."""
    shutil.copytree(PACKAGE, tmp_path / "qualify", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "qualify" / "core" / "upward.py").write_text("def f():\n    from qualify.release import folder\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0 and "BROKEN" in out.stdout and "qualify.core.upward" in out.stdout, out.stdout[-3000:]
