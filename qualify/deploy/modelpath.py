"""MODEL_PATH: a local model folder, mounted read-only and served offline. Preflight reads it once, bounded,
and refuses a folder the image's user cannot read, naming the file."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from qualify.deploy.compose import MODEL_DIR
from qualify.deploy.settings import Settings
from qualify.deploy.ui import EX_PREFLIGHT, Stop, Ui

MAX_ENTRIES = 100_000


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    files: int
    size: int  # bytes


def _can(st: os.stat_result, uid: int, gid: int, want: int) -> bool:
    """Whether uid/gid may `want` (4 read, 1 search) by the mode bits (the server is not root)."""
    if st.st_uid == uid:
        return bool(st.st_mode & (want << 6))
    if st.st_gid == gid:
        return bool(st.st_mode & (want << 3))
    return bool(st.st_mode & want)


def check(s: Settings, uid: int, user: str, ui: Ui) -> ModelFolder:
    root = s.model_path
    fix = f"make it readable: chmod -R a+rX {root} (or chown -R {uid}:{uid} {root}), or correct MODEL_PATH in " \
          f"{s.env_file}"
    if root is None:
        raise AssertionError("MODEL_PATH is empty")
    if not root.is_dir():
        raise Stop(EX_PREFLIGHT, f"MODEL_PATH={root}: not a folder", f"point MODEL_PATH in {s.env_file} at a model folder "
                   "(config.json, tokenizer, weights), e.g. one `python -m qualify tiny-model --out DIR` wrote")
    if not (root / "config.json").is_file():
        raise Stop(EX_PREFLIGHT, f"MODEL_PATH={root}: not a model folder (no config.json)",
                   f"point MODEL_PATH in {s.env_file} at the folder that holds config.json")
    files, size, seen = 0, 0, 0

    def judge(entry: str) -> os.stat_result:
        try:
            st = os.stat(entry)  # a link is judged by what it points to, as the server opens it
        except OSError as exc:
            raise Stop(EX_PREFLIGHT, f"MODEL_PATH={root}: {entry}: {exc.strerror}", fix) from None
        is_dir = stat.S_ISDIR(st.st_mode)
        if not _can(st, uid, uid, 4) or (is_dir and not _can(st, uid, uid, 1)):
            what = "folder" if is_dir else "file"
            raise Stop(EX_PREFLIGHT, f"MODEL_PATH={root}: the {what} {entry} is not readable by uid {uid} (the "
                       f"image's user {user}): mode {stat.S_IMODE(st.st_mode):04o}, owner {st.st_uid}:{st.st_gid}", fix)
        return st

    judge(str(root))
    for here, dirs, names in os.walk(root):
        for name in sorted(dirs) + sorted(names):
            seen += 1
            if seen > MAX_ENTRIES:
                raise Stop(EX_PREFLIGHT, f"MODEL_PATH={root}: more than {MAX_ENTRIES} files and folders; not a model "
                           "folder", f"point MODEL_PATH in {s.env_file} at the model's own folder")
            st = judge(os.path.join(here, name))
            if not stat.S_ISDIR(st.st_mode):
                files += 1
                size += st.st_size
    ui.say(f"model: {root} ({files} files, {size / (1 << 20):.1f} MiB), readable by uid {uid}; mounted read-only at "
           f"{MODEL_DIR}, served offline (HF_HUB_OFFLINE=1); MODEL_ID/MODEL_REVISION are not used")
    return ModelFolder(root, files, size)
