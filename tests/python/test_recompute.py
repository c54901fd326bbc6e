"""A block's recompute in backward computes what its forward computed: under the forward's
autocast state (issue 28), and with its backward reached even when no block input requires
grad (issue 27, item 5)."""
import torch
import torch.nn.functional as F

import strata
from gpt_model import GPT, batches


def _deltas(model, start):
    return {n: start[n] - p.detach() for n, p in model.named_parameters()}


def _one_step_update(offloaded, step):
    """The weights' change over one step of AdamW(lr=eps=1e3, no decay): at step 1 that is
    g / (|g|/1e3 + 1), the gradient itself to within |g|/1e3, so comparing the changes
    compares the gradients."""
    model = GPT()
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    kw = dict(lr=1e3, eps=1e3, weight_decay=0.0)
    if offloaded:
        eng = strata.Engine(device="cpu")
        model = strata.offload(model, blocks=list(model.blocks), engine=eng)
        opt = strata.optim.AdamW(model.parameters(), **kw)
    else:
        opt = torch.optim.AdamW(model.parameters(), **kw)
    step(model)
    opt.step()
    if offloaded:
        after = eng._model.gather()
        eng.close()
        return {n: start[n] - after[n] for n in start}
    return _deltas(model, start)


def _assert_same_gradients(ours, theirs, tol):
    for n, b in theirs.items():
        err = (ours[n] - b).abs().max().item() / b.abs().max().item()
        assert err <= tol, f"{n}: the gradient differs from torch's by {err:.3g} of its largest"


def test_recompute_runs_under_the_forwards_autocast():
    """Forward under torch.autocast("cpu", bfloat16), loss.backward() outside it, as the
    autocast documentation has it: the blocks' recompute must run in bfloat16 too, or the
    gradient is that of another (fp32) forward: 1.5e-4 of the largest element off torch's,
    where the recompute under autocast is within 1.5e-6 (bf16 roundings that tip with the
    order of fp32 sums)."""
    (x, y), = next(batches(1, 1))

    def step(model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()

    ours, theirs = _one_step_update(True, step), _one_step_update(False, step)
    _assert_same_gradients(ours, theirs, 1e-5)


class FeaturesGPT(GPT):
    """Its blocks read input features directly: the first block's input is data, which does
    not require grad."""

    def forward(self, feats, targets):
        x = feats
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def test_blocks_train_when_no_block_input_requires_grad():
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(4, 16, 32, generator=g)
    (_, y), = next(batches(1, 1))
    losses = {}
    for offloaded in (True, False):
        model = FeaturesGPT()
        kw = dict(lr=1e-2, weight_decay=0.0)
        if offloaded:
            eng = strata.Engine(device="cpu")
            model = strata.offload(model, blocks=list(model.blocks), engine=eng)
            opt = strata.optim.AdamW(model.parameters(), **kw)
        else:
            opt = torch.optim.AdamW(model.parameters(), **kw)
        losses[offloaded] = []
        for _ in range(4):
            loss = model(feats, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[offloaded].append(loss.item())
    for a, b in zip(losses[True], losses[False]):
        assert abs(a - b) <= 1e-4 * abs(b), losses
    assert losses[True][-1] < losses[True][0]


def test_the_anchor_gets_no_gradient():
    """The tensor that makes autograd reach the blocks' backward accumulates nothing."""
    eng = strata.Engine(device="cpu")
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(model.parameters())
    (x, y), = next(batches(1, 1))
    model(x, y).backward()
    opt.step()
    assert eng._model.anchor.grad is None
    eng.close()


