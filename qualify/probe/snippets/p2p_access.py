"""Peer-to-peer access between the GPUs a tensor-parallel server would use: what the driver reports, and what a
real transfer does (the input of vLLM's custom all-reduce decision; probe/p2p.py judges it).

usage: p2p_access.py WORLD_SIZE [ENV_JSON]
ENV_JSON: the environment to run under, as for nccl_allreduce.py (the server's: core/ncclenv.py), set before
torch is imported; the children inherit it and report what they saw.

- driver: torch.cuda.can_device_access_peer(i, j) for every ordered pair i != j (cudaDeviceCanAccessPeer);
- transfer: for every ordered pair (i, j), i == j included, what vLLM's own check does
  (vllm/distributed/device_communicators/all_reduce_utils.py: can_actually_p2p), because a driver can report
  P2P that does not work (vllm-project/vllm#2728): a producer process allocates 1 KiB on GPU i and fills it
  with 1s, hands a CUDA IPC handle to a consumer process, which opens it on GPU j, fills it with 2s, and
  both read it back. Written and read back as 2s on both sides is a working transfer; a handle that does not
  open, other bytes, or a process that hangs is not. i == i proves CUDA IPC itself in this container (the
  custom all-reduce's buffers are IPC buffers).

CUDA's runtime is called through ctypes (the libcudart torch loaded: the children need no torch), one pair at
a time, each bounded by a timeout. Prints one JSON object.
"""

import ctypes
import json
import os
import sys

TIMEOUT_S = 60
NBYTES = 1024
MEMCPY_DEVICE_TO_HOST = 2
IPC_LAZY_ENABLE_PEER_ACCESS = 1


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_byte * 64)]  # cudaIpcMemHandle_t


class _Cudart:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p

    def __call__(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name}: {self.lib.cudaGetErrorString(rc).decode(errors='replace')} ({rc})")

    def malloc(self, nbytes):
        ptr = ctypes.c_void_p()
        self("cudaMalloc", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr

    def read(self, ptr):
        host = (ctypes.c_ubyte * NBYTES)()
        self("cudaMemcpy", host, ptr, ctypes.c_size_t(NBYTES), MEMCPY_DEVICE_TO_HOST)
        return bytes(host)


def _loaded_cudart():
    """The libcudart this process loaded (torch's), from /proc/self/maps."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            path = line.split()[-1] if line.strip() else ""
            if "libcudart" in os.path.basename(path):
                return path
    return None


def _producer(path, pairs, to_consumer, from_consumer, results, names):
    results.put(("env", {k: os.environ.get(k) for k in names}, ""))  # what these processes ran under
    cuda = _Cudart(path)
    for i, _ in pairs:
        ok, error, sent = False, "", False
        try:
            cuda("cudaSetDevice", i)
            ptr = cuda.malloc(NBYTES)
            cuda("cudaMemset", ptr, 1, ctypes.c_size_t(NBYTES))
            cuda("cudaDeviceSynchronize")
            handle = _Handle()
            cuda("cudaIpcGetMemHandle", ctypes.byref(handle), ptr)
            to_consumer.put(bytes(handle))
            sent = True
            if from_consumer.get(timeout=TIMEOUT_S):  # the consumer opened it, wrote 2s and closed it
                ok = cuda.read(ptr) == b"\x02" * NBYTES
                error = "" if ok else "the consumer's write did not arrive in this GPU's memory"
            else:
                error = "the consumer could not write through the handle"
            cuda("cudaFree", ptr)
        except Exception as exc:  # noqa: BLE001 (any failure of the pair is its result)
            error = error or str(exc)
            if not sent:
                to_consumer.put(None)  # the consumer waits for this pair's handle
        results.put(("producer", ok, error))


def _consumer(path, pairs, from_producer, to_producer, results):
    cuda = _Cudart(path)
    for _, j in pairs:
        ok, error = False, ""
        raw = from_producer.get(timeout=TIMEOUT_S)
        if raw is None:  # the producer failed before it made a handle, and waits for no answer
            results.put(("consumer", False, "the producer made no handle"))
            continue
        try:
            cuda("cudaSetDevice", j)
            handle = _Handle.from_buffer_copy(raw)
            ptr = ctypes.c_void_p()
            cuda("cudaIpcOpenMemHandle", ctypes.byref(ptr), handle, IPC_LAZY_ENABLE_PEER_ACCESS)
            cuda("cudaMemset", ptr, 2, ctypes.c_size_t(NBYTES))
            cuda("cudaDeviceSynchronize")
            ok = cuda.read(ptr) == b"\x02" * NBYTES
            error = "" if ok else "read back other bytes than written"
            cuda("cudaIpcCloseMemHandle", ptr)
        except Exception as exc:  # noqa: BLE001
            ok, error = False, error or str(exc)
        to_producer.put(ok)
        results.put(("consumer", ok, error))


def _transfers(torch, path, world, names):
    ctx = torch.multiprocessing.get_context("spawn")
    pairs = [(i, j) for i in range(world) for j in range(world)]
    a, b, results = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_producer, args=(path, pairs, a, b, results, names)),
             ctx.Process(target=_consumer, args=(path, pairs, a, b, results))]
    for p in procs:
        p.start()
    out, env = [], {}
    try:
        _, env, _ = results.get(timeout=TIMEOUT_S)
        for i, j in pairs:
            got = dict((side, (ok, err)) for side, ok, err in (results.get(timeout=TIMEOUT_S) for _ in range(2)))
            producer, consumer = got.get("producer", (False, "no answer")), got.get("consumer", (False, "no answer"))
            out.append({"src": i, "dst": j, "ok": bool(producer[0] and consumer[0]),
                        "error": producer[1] or consumer[1]})
    except Exception:  # noqa: BLE001 (queue.Empty: a process hung or died; the rest did not run)
        done = {(r["src"], r["dst"]) for r in out}
        out += [{"src": i, "dst": j, "ok": False, "error": f"no answer within {TIMEOUT_S} s (hung or died)"}
                for i, j in pairs if (i, j) not in done]
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    return out, env, [p.exitcode for p in procs]


def main():
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    given = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise SystemExit("ENV_JSON must be a JSON object of names and string values")
    os.environ.update(given)
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    world = world or visible
    out = {"world_size": world, "visible": visible, "env": given}
    if visible < world or world < 1:
        out.update(ok=False, skipped=f"{visible} GPU(s) visible, world size {world}")
        print(json.dumps(out))
        return
    torch.cuda.init()
    path = _loaded_cudart()
    if path is None:
        out.update(ok=False, error="the CUDA runtime torch loaded (libcudart) is not in /proc/self/maps")
        print(json.dumps(out))
        return
    out["cudart"] = path
    out["driver"] = [{"src": i, "dst": j, "peer": bool(torch.cuda.can_device_access_peer(i, j))}
                     for i in range(world) for j in range(world) if i != j]
    out["transfer"], out["child_env"], out["exit_codes"] = _transfers(torch, path, world, sorted(given))
    out["ok"] = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
