"""Writing an offloaded (or plain) model's weights: strata.save_safetensors."""
import json
import os
import struct

import torch

from . import _strata

__all__ = ["save_safetensors"]


def save_safetensors(model, path):
    """Writes the model's current weights (fp32) as a safetensors file; for an offloaded model
    they are gathered from the engine. Tied parameters are written once."""
    state = None
    for p in model.parameters():
        state = getattr(p, "_strata_offload", None)
        break
    if state is not None:
        tensors = state.gather()
    else:
        tensors = {n: p.detach().to("cpu", torch.float32).contiguous()
                   for n, p in model.named_parameters()}
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        nbytes = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        blobs.append(t)
        offset += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    # The CLI's writer (include/strata/atomic_file.h): a temporary created O_EXCL|O_NOFOLLOW next
    # to `path`, fsynced and renamed over it, so `path` holds the old file or the whole new one
    # and nothing planted at a predictable name is followed; removed again on any failure.
    f = _strata.AtomicFile(os.fspath(path))
    try:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for t in blobs:
            f.write_from(t.data_ptr(), t.numel() * t.element_size())
        f.commit()
    finally:
        f.discard()
