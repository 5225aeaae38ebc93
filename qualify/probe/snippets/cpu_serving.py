"""vLLM's CPU build, asked in a child interpreter: does it import, and which attention backend it selects.

transformers first: a CUDA torchvision beside torch's +cpu build breaks `import transformers`
(operator torchvision::nms does not exist), and vLLM's server imports it at start.
"""

import json
import types

out = {}
import transformers  # noqa: E402

out["transformers"] = transformers.__version__
import torch  # noqa: E402

out["torch"] = torch.__version__
out["torch_cuda"] = torch.version.cuda
from vllm.platforms import current_platform  # noqa: E402

out["device_type"] = current_platform.device_type
# vLLM's own selector, for a plain decoder (no MLA, no sparse attention: the case the tiny model and most
# served models are); it reads only these two fields of its config.
config = types.SimpleNamespace(use_mla=False, use_sparse=False)
path = current_platform.get_attn_backend_cls(None, config)
out["attention_backend_path"] = path
module, _, name = path.rpartition(".")
backend = getattr(__import__(module, fromlist=[name]), name)
out["attention_backend"] = backend.get_name()
try:
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    out["attention_isa"] = _get_attn_isa(torch.bfloat16, 16, 64)
except Exception as exc:  # a private helper: its absence is not a failure
    out["attention_isa_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
