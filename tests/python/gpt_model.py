"""A small GPT-2 written as an ordinary nn.Module (blocks in a ModuleList, tied head), shared by
the offload tests and examples/train_gpt.py's test."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, dim, heads, dropout=0.0):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.attn_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.heads)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + self.drop(self.attn_proj(y))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, vocab=64, seq=16, dim=32, heads=4, layers=3, dropout=0.0, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        for n, p in self.named_parameters():
            if n.endswith("weight") and p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def param_groups(model, weight_decay):
    """GPT-2's usual split: matrices decay, biases and norms do not."""
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": rest, "weight_decay": 0.0}]


def batches(steps, micro, batch=4, seq=16, vocab=64, seed=1):
    """Learnable rows: each counts up from a random start by a random stride (mod vocab)."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        out = []
        for _ in range(micro):
            start = torch.randint(0, vocab, (batch, 1), generator=g)
            stride = torch.randint(1, 4, (batch, 1), generator=g)
            t = (start + stride * torch.arange(seq + 1)) % vocab
            out.append((t[:, :-1], t[:, 1:]))
        yield out


class HfStyleBlock(Block):
    """A block called as Hugging Face's GPT2Block is: keyword arguments (a mask tensor, flags)
    and a tuple back (hidden states, then None for the cache)."""

    def forward(self, hidden_states, attention_mask=None, use_cache=False):
        x = super().forward(hidden_states)
        if attention_mask is not None:
            x = x * attention_mask
        return (x, None)


class HfStyleGPT(GPT):
    def __init__(self, **kw):
        super().__init__(**kw)
        dim, heads = self.wte.weight.shape[1], self.blocks[0].heads
        torch.manual_seed(1)
        self.blocks = nn.ModuleList(HfStyleBlock(dim, heads) for _ in range(len(self.blocks)))

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        mask = torch.ones(1, idx.shape[1], 1)
        for b in self.blocks:
            x = b(x, attention_mask=mask, use_cache=False)[0]
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))
