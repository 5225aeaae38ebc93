"""`python -m qualify inspect PATH... [--target 12.1] [--json [--detail]] [--registered-only] [--jobs N]`.

Files are read by worker processes (one per CPU, at most 8; `--jobs 1` reads
in this process), large ones in parts; the report is the same either way
(core/workers.py, core/parts.py).

The census reports; it does not judge: the exit status is 0 whenever the scan
ran, even when libraries have no code for the target or files could not be
parsed (those are listed with their reasons). It is non-zero for usage errors
(2: a bad target, a path that does not exist) and when a path could not be
read at all (11, as for an unparseable binary: a directory that cannot be
listed, a file that cannot be opened, permission denied on the way to a path
given): the census is then incomplete, and says which paths it is missing.
"""

from __future__ import annotations

import json
import os
import sys

from qualify.core import arch, census, workers
from qualify.core.errors import ConfigError, ParseError

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (start-up)
    from typing import List, Optional, Sequence

# The plain forms (`inspect FILE --json`) are parsed without argparse: scripts run this once per library, and
# argparse cost more of its start-up than reading a small library does (cli/simple_args.py).
SIMPLE_ARGV = True

_MAX_NO_CODE_LISTED = 10


def configure_parser(parser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="libraries, cubins, fatbins or directories to walk")
    parser.add_argument("--target", help="device capability to judge against: 12.1, sm_121 or sm121")
    parser.add_argument("--json", action="store_true", help="print the census as JSON (manifests/inspect.schema.json)")
    parser.add_argument("--detail", action="store_true", help="with --json: every container and entry")
    parser.add_argument(
        "--registered-only",
        action="store_true",
        help="read .nv_fatbin only (what cuobjdump lists): faster, but blind to kernel databases such as cuFFT's",
    )
    parser.add_argument(
        "--no-decompress",
        action="store_true",
        help="never decompress (as inside an image): compressed containers' kernels are then unknown",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        default=workers.default_jobs(),
        metavar="N",
        help=f"read files in N processes (default: the CPUs here, at most {workers.MAX_DEFAULT_JOBS}; 1: in this process)",
    )


def execute(args) -> int:
    target = _parse_target(args.target)
    missing = [p for p in args.paths if _missing(p)]
    if missing:
        raise ConfigError(f"no such file or directory: {', '.join(missing)}", hint="check the PATH arguments")
    report = census.scan(
        args.paths, target, detail=args.detail, embedded=not args.registered_only, decompress=not args.no_decompress,
        jobs=args.jobs,
    )
    if args.json:
        json.dump(report.to_json(), sys.stdout, sort_keys=True, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render(report))
    if report.unreadable:
        from qualify.core.report import emit  # here only: the census's start-up never needs it

        emit(f"error: {len(report.unreadable)} path(s) could not be read; the census is incomplete")
        return ParseError.exit_code
    return 0


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 256:
        import argparse

        raise argparse.ArgumentTypeError(f"--jobs {text!r}: give a whole number of processes from 1 to 256")
    return value


def _missing(path: str) -> bool:
    """Really absent. A path behind a directory without search permission is
    not "missing": lstat fails with EACCES, and the census reports it as unreadable."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _parse_target(text: Optional[str]) -> Optional[arch.Capability]:
    if text is None:
        return None
    try:
        return arch.Capability.parse(text)
    except arch.ArchError as exc:
        raise ConfigError(str(exc), hint="use e.g. --target 12.1") from None


# --- human output ----------------------------------------------------------------


def _short(names: Sequence[str]) -> str:
    """`sm_100 sm_120a` -> `100 120a` (the column header says sm_ or compute_)."""
    return " ".join(n.split("_", 1)[1] for n in names) or "-"


def _row(lib: census.LibraryCensus) -> List[str]:
    data = lib.to_json()
    linked = data["link_only"]["sass"] + data["link_only"]["ptx"]
    row = [lib.path, "archive" if data.get("archive") else str(data["containers"]), _short(data["sass"]),
           _short(data["ptx"]), " ".join(linked) or "-"]
    verdict = data["verdict"]
    if verdict is not None:
        klass = verdict["class"] or ("-" if lib.summary.errors else "no code")
        if verdict["cross_generation_jit"]:
            klass += " (cross-gen JIT)"
        row += [klass, verdict["best"] or "-", f"{len(verdict['no_code'])}/{verdict['units']}"]
    row.append(str(len(lib.summary.errors)) if lib.summary.errors else "")
    return row


def render(report: census.CensusReport) -> str:
    """A readable table, then the containers without code and the files with errors."""
    from qualify.host.tables import table  # only for people: `--json` (scripts, one run per file) never needs it

    lines: List[str] = []
    header = ["LIBRARY", "CONTAINERS", "SASS (sm_)", "PTX (compute_)", "LINK-ONLY (never loaded)"]
    if report.target is not None:
        header += [f"CLASS FOR {report.target}", "BEST", "NO CODE"]
    header.append("ERRORS")
    if report.libraries:
        lines += table([_row(lib) for lib in report.libraries], header, rule=False).splitlines()
    else:
        lines.append("no ELF, cubin or fatbin files with device code found")
    lines += _no_code_lines(report)
    lines += _archive_lines(report)
    lines += _error_lines(report)
    lines.append(_summary_line(report))
    return "\n".join(lines) + "\n"


def _no_code_lines(report: census.CensusReport) -> List[str]:
    lines: List[str] = []
    for lib in report.libraries:
        if lib.verdict is None or not lib.verdict.no_code:
            continue
        lines.append(f"\n{lib.path}: no code for {report.target} in:")
        for unit in lib.verdict.no_code[:_MAX_NO_CODE_LISTED]:
            data = unit.to_json()
            section = unit.section or "container"
            where = f"{section} at {unit.offset:#x}" if unit.offset is not None else f"all of {section}"
            arches = " ".join(data["sass"] + data["ptx"]) or "-"
            lines.append(f"  {where}: {arches}")
        hidden = len(lib.verdict.no_code) - _MAX_NO_CODE_LISTED
        if hidden > 0:
            lines.append(f"  ... and {hidden} more (--json lists all)")
    return lines


def _archive_lines(report: census.CensusReport) -> List[str]:
    archives = [lib for lib in report.libraries if lib.summary.archive]
    if not archives:
        return []
    lines = ["\nstatic archives (link inputs: linked into other binaries, never loaded; members counted, not read):"]
    lines += [f"  {lib.path}: {lib.summary.archive[0]} member(s), {lib.summary.archive[1]} with device code"
              for lib in archives]
    return lines


def _error_lines(report: census.CensusReport) -> List[str]:
    lines: List[str] = []
    for lib in report.with_errors:
        lines.append(f"\n{lib.path}: could not be fully parsed:")
        lines += [f"  {reason}" for reason in lib.summary.errors[:_MAX_NO_CODE_LISTED]]
        hidden = len(lib.summary.errors) - _MAX_NO_CODE_LISTED
        if hidden > 0:
            lines.append(f"  ... and {hidden} more (--json lists all)")
    return lines


def _summary_line(report: census.CensusReport) -> str:
    scope = "" if report.embedded else " (.nv_fatbin only: data sections not searched)"
    unreadable = f", {len(report.unreadable)} unreadable" if report.unreadable else ""
    return (
        f"\n{len(report.libraries)} file(s) reported, {report.files_scanned} examined, "
        f"{len(report.without_device_code)} ELF file(s) without device code, "
        f"{len(report.with_errors)} with errors{unreadable}{scope}"
    )
