"""Which part of the engine holds each parameter of an offloaded model: one block (an entry of
`blocks`, in forward order) or the rest (the parameters outside every block: embeddings, the
final norm, a tied head), and the one dtype they share. Computed once, at strata.offload.
"""
import torch

from ._strata import Error


def assign_owners(model, blocks):
    """(rest, block_params): rest = [(name, param)] outside the blocks; block_params =
    [(prefix, [(name within the block, param)])] per block. A parameter may be shared within
    one block or within the rest, not across them (strata.Error naming it); a block without
    parameters is refused."""
    owner = {}  # id(param) -> ("rest", None) or ("block", index into blocks)
    names = {id(p): n for n, p in model.named_parameters()}
    block_of_module = {}
    for i, b in enumerate(blocks):
        for m in b.modules():
            block_of_module.setdefault(id(m), i)
    for m in model.modules():
        bi = block_of_module.get(id(m))
        for p in m._parameters.values():
            if p is None:
                continue
            where = ("rest", None) if bi is None else ("block", bi)
            prev = owner.get(id(p))
            if prev is not None and prev != where:
                a = "outside the blocks" if prev[0] == "rest" else f"block {prev[1]}"
                b = "outside the blocks" if where[0] == "rest" else f"block {where[1]}"
                raise Error(f"parameter {names[id(p)]!r} is shared by {a} and {b}; the "
                            "engine holds each parameter in one place: a parameter may be "
                            "shared within one block or outside the blocks, not across them")
            owner[id(p)] = where
    rest = [(n, p) for n, p in model.named_parameters() if owner[id(p)][0] == "rest"]
    block_params = []
    for i, b in enumerate(blocks):
        prefix = [n for n, m in model.named_modules() if m is b][0]
        ps = [(n[len(prefix) + 1:] if prefix else n, p)
              for n, p in model.named_parameters()
              if owner[id(p)] == ("block", i) and id(p) in {id(q) for q in b.parameters()}]
        if not ps:
            raise Error(f"blocks[{i}] ({prefix}) has no parameters; list only blocks that "
                        "hold parameters")
        block_params.append((prefix, ps))
    return rest, block_params


def model_dtype(model, named=None):
    """The one dtype of the model's parameters (or of `named`, [(name, param)]: the trainable
    ones), float32 or bfloat16 (strata.Error otherwise)."""
    dtypes = {}
    for n, p in (model.named_parameters() if named is None else named):
        dtypes.setdefault(p.dtype, n)
    if torch.float16 in dtypes:
        raise Error(f"parameter {dtypes[torch.float16]!r} is float16; strata.offload does not "
                    "train in fp16 (its gradients never reach .grad, so a GradScaler could not "
                    "unscale or check them): use model.bfloat16() or model.float()")
    if len(dtypes) > 1 or not set(dtypes) <= {torch.float32, torch.bfloat16}:
        found = ", ".join(f"{d} ({n!r})" for d, n in dtypes.items())
        which = "trainable parameters" if named is not None else "parameters"
        raise Error(f"the {which} of an offloaded model are all float32 or all bfloat16 (the "
                    f"engine computes in one dtype); found {found}: call model.float() or "
                    "model.bfloat16() first")
    return next(iter(dtypes), torch.float32)
