"""What torch says about itself: version, CUDA, claimed arch list, cuDNN, NCCL, devices."""

import json

import torch

out = {
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "arch_list": torch.cuda.get_arch_list(),
    "cuda_available": torch.cuda.is_available(),
}
try:
    out["cudnn"] = torch.backends.cudnn.version()
except Exception as exc:  # cuDNN missing or broken: record, do not fail the snippet
    out["cudnn_error"] = str(exc)
try:
    out["nccl"] = ".".join(str(p) for p in torch.cuda.nccl.version())
except Exception as exc:
    out["nccl_error"] = str(exc)
if out["cuda_available"]:
    out["devices"] = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out["devices"].append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                               "total_memory": p.total_memory, "multiprocessors": p.multi_processor_count})
print(json.dumps(out))
