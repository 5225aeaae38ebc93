"""`nox -s vllm-rules`: are the provider tables still vLLM's own rules?

Runs vLLM's selector functions inside the built vLLM image, once per
capability, with vLLM's CUDA platform made to report that capability
(the snippet's `--assume-capability`, mode `evaluated`), and compares each
choice with the `selections` of the rule data (default
qualify/probe/rules/vllm-0.33.json). No GPU is needed: a stand-in libcuda
(every driver call answers 'no device'), compiled inside the image, lets
vLLM import; nothing is launched. Prints a table; exit 1 on a mismatch.

    python -m qualify.devtools.vllm_rules [--image REF] [--target sm120] [--rules FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional

from qualify.config import targets
from qualify.core.errors import ConfigError, QualifyError
from qualify.core.report import Reporter, emit
from qualify.host import tables
from qualify.host.engine import Engine
from qualify.imagebuild.image import load_record
from qualify.probe.providers import observed_name, rules
from qualify.qualification import container

REPORT = Reporter("vllm-rules")

# A STAND-IN for the NVIDIA driver (none on a build host): enough symbols for vLLM to import.
_STUB = " ".join(f"int {name}(void){{return 100;}}" for name in (
    "cuInit", "cuCtxGetCurrent", "cuCtxSetCurrent", "cuDeviceGetAttribute", "cuDevicePrimaryCtxRetain",
    "cuDriverGetVersion", "cuGetErrorString", "cuGetProcAddress_v2", "cuGetProcAddress", "cuMemAddressFree",
    "cuMemAddressReserve", "cuMemCreate", "cuMemGetAllocationGranularity", "cuMemMap", "cuMemRelease",
    "cuMemSetAccess", "cuMemUnmap", "cuPointerGetAttribute", "cuTensorMapEncodeTiled"))


def _script(cap: str) -> str:
    return (f"mkdir -p /tmp/stub && printf '%s\\n' '{_STUB}' > /tmp/stub/stub.c "
            "&& gcc -shared -fPIC -o /tmp/stub/libcuda.so.1 /tmp/stub/stub.c "
            f"&& LD_LIBRARY_PATH=/tmp/stub python3 {container.CONTAINER_ROOT}/qualify/probe/snippets/vllm_providers.py "
            f"--assume-capability {cap}")


def evaluate(engine: Engine, image: str, platform: str, cap: str, names: Dict[str, str],
             dump: Optional[Path] = None) -> Dict[str, Optional[str]]:
    mount = container.stage_probe(container.probe_sources_digest())
    proc = engine.run_container(image, ["bash", "-c", _script(cap)],
                                mounts=[(str(mount), container.CONTAINER_ROOT, "ro")],
                                env={"PYTHONPATH": container.CONTAINER_ROOT}, platform=platform, timeout=900)
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise QualifyError(f"vLLM's selectors did not answer for {cap} (exit {proc.returncode}):\n"
                           + "\n".join(proc.stderr.strip().splitlines()[-15:]))
    data = json.loads(lines[-1])
    if dump is not None:  # the whole answer (order, rejections and vLLM's reasons), for writing the tables
        dump.mkdir(parents=True, exist_ok=True)
        (dump / f"selectors-{cap}.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    if data.get("status") != "ok":
        raise QualifyError(f"vLLM's selectors for {cap}: {data.get('status')}: {data.get('reason')}")
    return {key: observed_name(key, section, names) for key, section in data.get("sections", {}).items()}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qualify.devtools.vllm_rules", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="sm120", help="whose built vLLM image to use (default sm120)")
    parser.add_argument("--base", default="hermetic", choices=targets.BASE_KINDS)
    parser.add_argument("--image", help="a vLLM image reference (default: the target's built vLLM image)")
    parser.add_argument("--rules", default=rules.DEFAULT_FILE, help="the rule data to check (default: the probe's)")
    parser.add_argument("--dump", type=Path, default=None, help="write each capability's whole answer to DIR")
    args = parser.parse_args(argv)
    try:
        data = rules.load(args.rules)
        t = targets.load().get(args.target)
        image = args.image
        if not image:
            record = load_record(args.target, "vllm", args.base)
            if record is None:
                raise ConfigError(f"no built vLLM image for {args.target}",
                                  hint=f"nox -s build-{args.target} -- --base {args.base} --profile vllm, or --image REF")
            image = record.image_reference
        engine = Engine("docker").check()
        rows, mismatches = [], 0
        for cap, expected in sorted(data.selections.items()):
            REPORT.say(f"evaluating vLLM's selectors for {cap} in {image}")
            got = evaluate(engine, image, t.platform, cap, data.observed_names, args.dump)
            for key, want in sorted(expected.items()):
                ok = got.get(key) == want
                mismatches += not ok
                rows.append([cap, key, want, str(got.get(key)), "yes" if ok else "NO"])
        print(tables.table(rows, ["capability", "provider", "table", "vLLM", "agree"]))
        print(f"{len(rows) - mismatches} of {len(rows)} choices agree")
        return 1 if mismatches else 0
    except QualifyError as exc:
        emit(f"error: {exc}")
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
