"""The CUDA architecture model: names, TORCH_CUDA_ARCH_LIST, the compatibility rule."""

import pytest

from qualify.core import arch
from qualify.core.arch import Capability, CodeTarget, Compat

CODES = ["sm_80", "sm_90a", "sm_100", "sm_100a", "sm_100f", "sm_120", "sm_120a", "sm_120f", "sm_121",
         "compute_80", "compute_120", "compute_120a"]
N, C, J, X = Compat.NATIVE, Compat.COMPATIBLE, Compat.PTX_JIT, Compat.NONE

# Rows: device capability; columns: CODES in order (the rules in ARCHITECTURE.md).
TABLE = {
    "10.0": [X, X, N, N, N, X, X, X, X, J, X, X],
    "10.3": [X, X, C, X, C, X, X, X, X, J, X, X],
    "11.0": [X, X, X, X, X, X, X, X, X, J, X, X],
    "12.0": [X, X, X, X, X, N, N, N, X, J, J, J],
    "12.1": [X, X, X, X, X, C, X, C, N, J, J, X],
    "13.0": [X, X, X, X, X, X, X, X, X, J, J, X],  # unknown future device: only plain PTX JITs
}


@pytest.mark.parametrize("device", sorted(TABLE))
@pytest.mark.parametrize("index", range(len(CODES)))
def test_compatibility_table(device, index):
    code = CodeTarget.parse(CODES[index])
    assert arch.compatibility(code, Capability.parse(device)) is TABLE[device][index], (CODES[index], device)


@pytest.mark.parametrize("text,expected", [
    ("sm_121a", ("sass", 12, 1, "a")), ("sm_100f", ("sass", 10, 0, "f")), ("compute_120a", ("ptx", 12, 0, "a")),
    ("sm_80", ("sass", 8, 0, "")), ("compute_121", ("ptx", 12, 1, "")), ("SM_90A", ("sass", 9, 0, "a")),
])
def test_parse_and_render_code_targets(text, expected):
    t = CodeTarget.parse(text)
    assert (t.kind.value, t.capability.major, t.capability.minor, t.variant.value) == expected
    assert str(t) == text.lower()


@pytest.mark.parametrize("bad", ["sm_", "sm_5", "sm_121x", "compute", "121", "gfx90a", "sm_1210"])
def test_bad_code_targets_are_refused(bad):
    with pytest.raises(arch.ArchError):
        CodeTarget.parse(bad)


@pytest.mark.parametrize("text,cap", [("12.1", (12, 1)), ("121", (12, 1)), ("sm_121", (12, 1)), ("sm121", (12, 1)),
                                      ("sm_100a", (10, 0)), ("9.0", (9, 0))])
def test_capability_forms(text, cap):
    assert (Capability.parse(text).major, Capability.parse(text).minor) == cap


def test_torch_arch_list_entries_and_gencode():
    entries = arch.parse_torch_arch_list("12.1;12.0a 12.0+PTX")
    assert [str(e) for e in entries] == ["12.1", "12.0a", "12.0+PTX"]
    assert arch.gencode_flags("12.1;12.0a+PTX") == [
        "-gencode=arch=compute_121,code=sm_121",
        "-gencode=arch=compute_120a,code=sm_120a",
        "-gencode=arch=compute_120a,code=compute_120a",
    ]
    assert [str(t) for t in arch.expected_code_targets("10.0;10.0a")] == ["sm_100", "sm_100a"]


@pytest.mark.parametrize("bad", ["12.0f", "", "12", "12.1;12.1", "sm_120"])
def test_torch_arch_list_refusals(bad):
    with pytest.raises(arch.ArchError):
        arch.parse_torch_arch_list(bad)


def test_f_suffix_refusal_says_why():
    with pytest.raises(arch.ArchError, match="rejects 'f'"):
        arch.TorchArch.parse("12.0f")


def test_arch_list_must_fit_the_target():
    assert arch.arch_list_problems("12.1;12.1a", Capability(12, 1)) == []
    assert arch.arch_list_problems("12.0", Capability(12, 1))  # runs, but not native
    assert any("family" in p for p in arch.arch_list_problems("12.1;10.0", Capability(12, 1)))


def test_families_and_recognition():
    assert arch.family_of(Capability(10, 3)).name == "sm_10x"
    assert arch.family_of(Capability(12, 1)).name == "sm_12x"
    assert arch.family_of(Capability(11, 0)).name == "sm_11x"
    assert arch.is_blackwell(Capability(12, 1)) and not arch.is_blackwell(Capability(9, 0))
    assert not arch.is_recognised(Capability(13, 0)) and "unknown" in arch.describe(Capability(13, 0))
    assert not arch.is_recognised(Capability(12, 7))


def test_cross_generation_and_triton_names():
    assert arch.is_cross_generation(CodeTarget.parse("compute_80"), Capability(12, 1))
    assert not arch.is_cross_generation(CodeTarget.parse("compute_120"), Capability(12, 1))
    assert arch.triton_gpu_name(Capability(12, 1)) == "sm_121a"
    assert arch.triton_gpu_name(Capability(8, 6)) == "sm_86"
    assert arch.best([Compat.PTX_JIT, Compat.COMPATIBLE, Compat.NONE]) is Compat.COMPATIBLE
