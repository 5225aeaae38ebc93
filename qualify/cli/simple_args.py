"""The plain forms of a command's arguments, read without argparse.

`python -m qualify inspect FILE --json` is run once per library by scripts,
and argparse cost more of its start-up than reading a small library does:
importing it (with gettext), and building a parser, which imports `shutil`
(bz2, lzma, fnmatch) for the terminal's width and `locale` for gettext.
So a command that sets `SIMPLE_ARGV = True` is parsed here when its
arguments are in the plain forms, from the same `configure_parser` calls
argparse gets: exact option names (`--json`, `--jobs 4`), one run of
positionals. Anything else (`--help`, `--jobs=4`, an abbreviation, `--`,
a value or path starting with `-`, a value its type refuses, an option this
reader does not model) gives None, and argparse parses the arguments as
before, with its messages. The two are compared on
generated arguments: where this reader answers, argparse answers the same
(tests/test_cli_args.py).

Standard library only.
"""

from __future__ import annotations

from types import SimpleNamespace

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing is not imported at run time (start-up)
    from typing import Dict, List, Optional


class _Unsupported(Exception):
    """configure_parser asked for something this reader does not model."""


class _Option:
    def __init__(self, names, kwargs) -> None:
        extra = set(kwargs) - {"action", "type", "default", "help", "metavar", "dest", "nargs"}
        action = kwargs.get("action", "store")
        positional = not names[0].startswith("-")
        nargs = kwargs.get("nargs")
        if extra or action not in ("store", "store_true") or (nargs is not None and not (positional and nargs == "+")):
            raise _Unsupported(names[0])
        if positional and (len(names) != 1 or action != "store"):
            raise _Unsupported(names[0])
        self.names, self.positional, self.flag = names, positional, action == "store_true"
        self.many = nargs == "+"
        self.type = kwargs.get("type")
        long = next((n for n in names if n.startswith("--")), names[0])
        self.dest = kwargs.get("dest") or long.lstrip("-").replace("-", "_")
        default = kwargs.get("default", False if self.flag else None)
        if isinstance(default, str) and self.type is not None:
            default = self.type(default)  # as argparse converts a string default
        self.default = default


class _Recorder:
    """Stands in for an ArgumentParser while configure_parser declares the options."""

    def __init__(self) -> None:
        self.options: List[_Option] = []

    def add_argument(self, *names, **kwargs) -> None:
        if not names:
            raise _Unsupported("an argument without a name")
        self.options.append(_Option(names, kwargs))

    def __getattr__(self, name):  # add_mutually_exclusive_group, set_defaults, ...: argparse's job
        raise _Unsupported(name)


def parse(configure, argv: List[str]) -> Optional[SimpleNamespace]:
    """The arguments as argparse would give them, or None where argparse must decide."""
    recorder = _Recorder()
    try:
        configure(recorder)
    except _Unsupported:
        return None
    by_name: Dict[str, _Option] = {}
    positionals = [o for o in recorder.options if o.positional]
    if len(positionals) > 1:
        return None
    for option in recorder.options:
        for name in option.names if not option.positional else ():
            if not name.startswith("--") or name in by_name:
                return None  # short options can be bundled (-ab): argparse's job
            by_name[name] = option
    values = {o.dest: o.default for o in recorder.options}
    given: List[str] = []
    state = "before"  # before the positionals, in them, after them
    at = 0
    while at < len(argv):
        token = argv[at]
        at += 1
        if not token.startswith("-"):
            if state == "after" or not positionals:
                return None  # a second run of positionals: argparse refuses it, in its words
            state = "in"
            given.append(token)
            continue
        option = by_name.get(token)
        if option is None:
            return None
        if state == "in":
            state = "after"
        if option.flag:
            values[option.dest] = True
            continue
        if at >= len(argv) or argv[at].startswith("-"):
            return None
        value = argv[at]
        at += 1
        if option.type is not None:
            try:
                value = option.type(value)
            except Exception:  # argparse says what is wrong with it
                return None
        values[option.dest] = value
    if positionals:
        (positional,) = positionals
        if not given or (not positional.many and len(given) != 1):
            return None
        try:
            converted = [positional.type(v) for v in given] if positional.type is not None else given
        except Exception:
            return None
        values[positional.dest] = converted if positional.many else converted[0]
    return SimpleNamespace(**values)
