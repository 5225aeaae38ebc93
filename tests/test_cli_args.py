"""`python -m qualify inspect FILE --json` reads its plain arguments without argparse (qualify/cli/simple_args.py,
for start-up): wherever that reader answers, argparse must answer exactly the same, and everything else
(help, errors, abbreviations, `--opt=value`, `--`) must be left to argparse."""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from pathlib import Path

import pytest

from qualify.cli import inspect_cmd, simple_args

REPO = Path(__file__).resolve().parents[1]

TOKENS = ["lib.so", "dir", "a b", "", "--json", "--detail", "--registered-only", "--no-decompress", "--target",
          "12.1", "sm_120", "nonsense", "--jobs", "2", "0", "300", "x", "-h", "--help", "--", "-", "--js",
          "--jobs=3", "--target=12.1", "-1", "--unknown", "--json=1", "--det"]


def _argparse(argv):
    parser = argparse.ArgumentParser(prog="t", exit_on_error=False)
    inspect_cmd.configure_parser(parser)
    try:
        return vars(parser.parse_args(argv))
    except (SystemExit, argparse.ArgumentError) as exc:
        return ("error", type(exc).__name__)


def _cases():
    rng = random.Random(43)
    yield from [["lib.so", "--json"], ["--json", "lib.so", "dir"], ["lib.so", "--target", "12.1", "--json"],
                ["--jobs", "1", "lib.so"], ["lib.so", "--json", "dir"], [], ["--json"], ["--jobs", "0", "lib.so"]]
    for _ in range(3000):
        yield [rng.choice(TOKENS) for _ in range(rng.randrange(6))]


def test_where_the_plain_reader_answers_argparse_answers_the_same(capsys):
    answered = 0
    for argv in _cases():
        ours = simple_args.parse(inspect_cmd.configure_parser, argv)
        theirs = _argparse(argv)
        capsys.readouterr()  # argparse's usage messages
        if ours is not None:
            answered += 1
            assert vars(ours) == theirs, argv
    assert answered > 300  # the plain forms are common among the generated ones


@pytest.mark.parametrize("argv", [["lib.so", "--json"], ["--json", "--target", "12.1", "a", "b"],
                                  ["--jobs", "1", "--no-decompress", "lib.so"]])
def test_the_plain_forms_need_no_argparse(argv):
    assert simple_args.parse(inspect_cmd.configure_parser, argv) is not None


@pytest.mark.parametrize("argv", [["--help"], ["lib.so", "--jobs=2"], ["lib.so", "--js"], ["--", "-lib.so"],
                                  ["lib.so", "--jobs", "0"], ["lib.so", "--json", "other.so"], ["--target", "-1", "a"]])
def test_everything_else_is_argparse_s(argv):
    assert simple_args.parse(inspect_cmd.configure_parser, argv) is None


def test_what_the_reader_does_not_model_goes_to_argparse():
    def choices(parser):
        parser.add_argument("--mode", choices=["a", "b"])

    def group(parser):
        parser.add_mutually_exclusive_group()

    def short(parser):
        parser.add_argument("-v", action="store_true")

    for configure in (choices, group, short):
        assert simple_args.parse(configure, []) is None


def test_the_cli_still_gives_argparse_s_errors_and_help():
    run = [sys.executable, "-m", "qualify", "inspect"]
    bad = subprocess.run([*run, "lib.so", "--jobs", "0"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "--jobs '0': give a whole number" in bad.stderr
    helped = subprocess.run([*run, "--help"], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert helped.returncode == 0 and "--registered-only" in helped.stdout
