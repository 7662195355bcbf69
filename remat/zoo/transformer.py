"""Transformer models: BERT-small (masked LM, post-LN encoder) and GPT-2 small (causal LM,
pre-LN decoder), as in POET's BERT experiments, Sage's BERT-small and OLLA's transformers.

Both use the same :class:`SelfAttention` (``qkv`` projection to ``heads x head_dim``, scaled
dot product, softmax, attention dropout, ``out`` projection) and :class:`FeedForward`
(``fc1`` 4x expansion, GELU, ``fc2``).  The usual intermediates carry ``checkpoint_name`` tags
(``qkv``, ``context``, ``attn_out``, ``mlp_hidden``, ``mlp_out``), as in MaxText, so users'
``save_only_these_names(...)`` policies can be written against them. Dropout takes its key from ``batch["dropout_rng"]``
(a raw ``uint32[2]`` key), so ``loss_fn(params, batch)`` stays pure; ``dropout=0.0`` removes
the random ops altogether.

* ``bert_small`` (Devlin et al. 2019; "BERT-Small" of Turc et al. 2019: L=4, H=512, A=8,
  I=2048): embeddings (word + learned position + one token type) -> LayerNorm -> dropout;
  ``layer{i}``: ``x = LN(x + drop(attn(x)))``, ``x = LN(x + drop(ffn(x)))``; ``mlm_head``
  (dense + GELU + LN) and the decoder tied to the word embeddings (+ bias). No pooler/NSP head.
  Default ``seq_len=64`` as in Sage's BERT-small input (64, 512). Loss: cross-entropy averaged
  over the masked positions (``batch["weights"]``).
* ``gpt2_small`` (Radford et al. 2019; 12 layers, 768 wide, 12 heads, 1024 positions):
  ``wte`` + ``wpe`` -> dropout; ``h{i}``: ``x = x + drop(attn(ln_1(x)))`` (causal),
  ``x = x + drop(ffn(ln_2(x)))``; ``ln_f``; logits by the tied ``wte``. Loss: mean next-token
  cross-entropy. With ``vocab_size=50257, max_len=1024`` it has the published 124,439,808
  parameters; the default ``vocab_size=8192`` keeps the zoo light (92,133,888).

The vocabulary is small by default (8192) in both models; real vocabularies (30522, 50257)
are one option away.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from remat.zoo._common import (
    ModelOptionError,
    ModelSpec,
    build_spec,
    check_positive,
    dropout_key,
    softmax_xent,
    weighted_softmax_xent,
)

MASK_ID = 1  # token id of [MASK]; ids 0..4 are reserved for special tokens


class SelfAttention(nn.Module):
    """Multi-head self-attention: ``x[B, T, D] -> [B, T, D]`` (``D = heads * head_dim``)."""

    num_heads: int
    dropout: float = 0.0
    causal: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        _, t, d = x.shape
        hd = d // self.num_heads
        qkv = checkpoint_name(nn.Dense(3 * d, name="qkv")(x), "qkv")
        qkv = qkv.reshape(x.shape[:2] + (3, self.num_heads, hd))
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each [B, T, H, hd]
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        if self.causal:
            mask = jnp.tril(jnp.ones((t, t), dtype=bool))
            scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        if self.dropout > 0:
            probs = nn.Dropout(self.dropout, deterministic=not train)(probs)
        y = checkpoint_name(jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(x.shape), "context")
        return checkpoint_name(nn.Dense(d, name="out")(y), "attn_out")


class FeedForward(nn.Module):
    """``x[B, T, D] -> fc2(gelu(fc1(x)))[B, T, D]`` with ``fc1`` of width ``mlp_dim``."""

    mlp_dim: int
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        h = checkpoint_name(nn.Dense(self.mlp_dim, name="fc1")(x), "mlp_hidden")
        y = nn.gelu(h, approximate=self.approximate_gelu)
        return checkpoint_name(nn.Dense(x.shape[-1], name="fc2")(y), "mlp_out")


class TransformerBlock(nn.Module):
    """One encoder/decoder layer; ``pre_ln`` selects GPT-2's pre-LN, else BERT's post-LN."""

    num_heads: int
    mlp_dim: int
    dropout: float = 0.0
    causal: bool = False
    pre_ln: bool = False

    def _drop(self, x: jax.Array, train: bool) -> jax.Array:
        return nn.Dropout(self.dropout, deterministic=not train)(x) if self.dropout > 0 else x

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = True) -> jax.Array:
        attn = SelfAttention(self.num_heads, self.dropout, self.causal, name="attn")
        ffn = FeedForward(self.mlp_dim, approximate_gelu=self.pre_ln, name="mlp")
        if self.pre_ln:
            x = x + self._drop(attn(nn.LayerNorm(epsilon=1e-5, name="ln_1")(x), train), train)
            return x + self._drop(ffn(nn.LayerNorm(epsilon=1e-5, name="ln_2")(x), train), train)
        x = nn.LayerNorm(epsilon=1e-12, name="attn_ln")(x + self._drop(attn(x, train), train))
        return nn.LayerNorm(epsilon=1e-12, name="out_ln")(x + self._drop(ffn(x, train), train))


class _ScanBlock(nn.Module):
    """:class:`TransformerBlock` in ``nn.scan``'s ``(carry, x) -> (carry, y)`` form."""

    num_heads: int
    mlp_dim: int
    dropout: float
    causal: bool
    pre_ln: bool
    train: bool = True

    @nn.compact
    def __call__(self, x: jax.Array, _) -> tuple[jax.Array, None]:
        block = TransformerBlock(self.num_heads, self.mlp_dim, self.dropout, causal=self.causal,
                                 pre_ln=self.pre_ln, name="block")
        return block(x, self.train), None


def _layers(x, *, scan: bool, num_layers: int, prefix: str, train: bool, remat_policy=None,
            **block):
    """``num_layers`` blocks: unrolled (``{prefix}{i}`` submodules) or one ``nn.scan`` over a
    stacked block (``layers``; parameters with a leading layer axis), as deep JAX models are
    written.  ``remat_policy``: each block under ``nn.remat(..., policy=remat_policy)``, the way
    users pick a JAX checkpoint policy by hand."""
    if scan:
        cls = _ScanBlock if remat_policy is None else nn.remat(
            _ScanBlock, policy=remat_policy, prevent_cse=False)
        stack = nn.scan(cls, variable_axes={"params": 0},
                        split_rngs={"params": True, "dropout": True}, length=num_layers)
        x, _ = stack(train=train, name="layers", **block)(x, None)
        return x
    cls = TransformerBlock if remat_policy is None else nn.remat(
        TransformerBlock, policy=remat_policy, static_argnums=(2,))
    for i in range(num_layers):
        x = cls(name=f"{prefix}{i}", **block)(x, train)
    return x


class BertMLM(nn.Module):
    """``tokens[B, T] -> logits[B, T, vocab]``: BERT encoder with the masked-LM head."""

    vocab_size: int = 8192
    hidden: int = 512
    num_layers: int = 4
    num_heads: int = 8
    mlp_dim: int = 2048
    max_len: int = 512
    dropout: float = 0.1
    scan: bool = False
    remat_policy: Any = None

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = True) -> jax.Array:
        init = nn.initializers.normal(0.02)
        word = nn.Embed(self.vocab_size, self.hidden, embedding_init=init, name="word_embeddings")
        pos = self.param("position_embeddings", init, (self.max_len, self.hidden))
        ttype = self.param("token_type_embeddings", init, (2, self.hidden))
        x = word(tokens) + pos[None, : tokens.shape[1]] + ttype[0]
        x = nn.LayerNorm(epsilon=1e-12, name="embeddings_ln")(x)
        if self.dropout > 0:
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = _layers(x, scan=self.scan, num_layers=self.num_layers, prefix="layer", train=train,
                    remat_policy=self.remat_policy, num_heads=self.num_heads,
                    mlp_dim=self.mlp_dim, dropout=self.dropout, causal=False, pre_ln=False)
        h = nn.gelu(nn.Dense(self.hidden, name="mlm_dense")(x), approximate=False)
        h = nn.LayerNorm(epsilon=1e-12, name="mlm_ln")(h)
        bias = self.param("mlm_bias", nn.initializers.zeros, (self.vocab_size,))
        return word.attend(h) + bias


class GPT2(nn.Module):
    """``tokens[B, T] -> logits[B, T, vocab]``: GPT-2 decoder with the tied LM head."""

    vocab_size: int = 8192
    hidden: int = 768
    num_layers: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    max_len: int = 1024
    dropout: float = 0.1
    scan: bool = False
    remat_policy: Any = None

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = True) -> jax.Array:
        init = nn.initializers.normal(0.02)
        wte = nn.Embed(self.vocab_size, self.hidden, embedding_init=init, name="wte")
        wpe = self.param("wpe", nn.initializers.normal(0.01), (self.max_len, self.hidden))
        x = wte(tokens) + wpe[None, : tokens.shape[1]]
        if self.dropout > 0:
            x = nn.Dropout(self.dropout, deterministic=not train)(x)
        x = _layers(x, scan=self.scan, num_layers=self.num_layers, prefix="h", train=train,
                    remat_policy=self.remat_policy, num_heads=self.num_heads,
                    mlp_dim=self.mlp_dim, dropout=self.dropout, causal=True, pre_ln=True)
        x = nn.LayerNorm(epsilon=1e-5, name="ln_f")(x)
        return wte.attend(x)


def _check(name, batch_size, seq_len, max_len, vocab_size, hidden, num_layers, num_heads,
           mlp_dim, dropout):
    check_positive(name, batch_size=batch_size, seq_len=seq_len, max_len=max_len,
                   vocab_size=vocab_size, hidden=hidden, num_layers=num_layers,
                   num_heads=num_heads, mlp_dim=mlp_dim)
    if seq_len > max_len:
        raise ModelOptionError(f"{name}: seq_len={seq_len} exceeds max_len={max_len}")
    if hidden % num_heads:
        raise ModelOptionError(f"{name}: hidden={hidden} is not divisible by num_heads={num_heads}")
    if vocab_size < 8:
        raise ModelOptionError(f"{name}: vocab_size={vocab_size} must be at least 8")
    if not 0.0 <= dropout < 1.0:
        raise ModelOptionError(f"{name}: dropout={dropout} must be in [0, 1)")


def build_bert_small(
    batch_size: int = 8,
    *,
    seq_len: int = 64,
    vocab_size: int = 8192,
    hidden: int = 512,
    num_layers: int = 4,
    num_heads: int = 8,
    mlp_dim: int | None = None,
    max_len: int = 512,
    dropout: float = 0.1,
    mask_prob: float = 0.15,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
    scan: bool = False,
    remat_policy: Any = None,
) -> ModelSpec:
    """``bert_small``: batch ``{"tokens": int32[B, T], "targets": int32[B, T],
    "weights": float32[B, T] (1 at masked positions), "dropout_rng": uint32[2]}``
    (no ``dropout_rng`` when ``dropout=0``). ``mlp_dim`` defaults to ``4 * hidden``.
    At least one position per sequence is masked.  ``scan=True``: the encoder layers are one
    ``nn.scan`` over a stacked block (same parameters, stacked on a leading layer axis).
    ``remat_policy``: every block under ``nn.remat(..., policy=remat_policy)`` (a JAX checkpoint
    policy chosen by hand, the baseline remat's planners compete with).
    """
    mlp_dim = 4 * hidden if mlp_dim is None else mlp_dim
    _check("bert_small", batch_size, seq_len, max_len, vocab_size, hidden, num_layers, num_heads,
           mlp_dim, dropout)
    rng = np.random.default_rng(seed)
    targets = rng.integers(5, vocab_size, (batch_size, seq_len), dtype=np.int32)
    masked = rng.random((batch_size, seq_len)) < mask_prob
    masked[np.arange(batch_size), rng.integers(0, seq_len, batch_size)] = True
    batch = {
        "tokens": np.where(masked, MASK_ID, targets).astype(np.int32),
        "targets": targets,
        "weights": masked.astype(np.float32),
    }
    if dropout > 0:
        batch["dropout_rng"] = dropout_key(seed)
    module = BertMLM(vocab_size=vocab_size, hidden=hidden, num_layers=num_layers,
                     num_heads=num_heads, mlp_dim=mlp_dim, max_len=max_len, dropout=dropout,
                     scan=scan, remat_policy=remat_policy)
    opts = dict(batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size, hidden=hidden,
                num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim, max_len=max_len,
                dropout=dropout, mask_prob=mask_prob, seed=seed, scan=scan)
    return build_spec(
        "bert_small", module, batch, input_key="tokens",
        objective=lambda logits, b: weighted_softmax_xent(logits, b["targets"], b["weights"]),
        seed=seed, abstract=abstract, options=opts, init=init)


def build_gpt2_small(
    batch_size: int = 8,
    *,
    seq_len: int = 128,
    vocab_size: int = 8192,
    hidden: int = 768,
    num_layers: int = 12,
    num_heads: int = 12,
    mlp_dim: int | None = None,
    max_len: int = 1024,
    dropout: float = 0.1,
    seed: int = 0,
    abstract: bool = False,
    init: str = "numpy",
    scan: bool = False,
    remat_policy: Any = None,
) -> ModelSpec:
    """``gpt2_small``: batch ``{"tokens": int32[B, T], "targets": int32[B, T] (tokens shifted by
    one), "dropout_rng": uint32[2]}`` (no ``dropout_rng`` when ``dropout=0``).
    ``mlp_dim`` defaults to ``4 * hidden``.  ``scan=True``: the decoder layers are one
    ``nn.scan`` over a stacked block (same parameters, stacked on a leading layer axis).
    ``remat_policy``: every block under ``nn.remat(..., policy=remat_policy)`` (a JAX checkpoint
    policy chosen by hand, the baseline remat's planners compete with).
    """
    mlp_dim = 4 * hidden if mlp_dim is None else mlp_dim
    _check("gpt2_small", batch_size, seq_len, max_len, vocab_size, hidden, num_layers, num_heads,
           mlp_dim, dropout)
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, vocab_size, (batch_size, seq_len + 1), dtype=np.int32)
    batch = {"tokens": seq[:, :-1].copy(), "targets": seq[:, 1:].copy()}
    if dropout > 0:
        batch["dropout_rng"] = dropout_key(seed)
    module = GPT2(vocab_size=vocab_size, hidden=hidden, num_layers=num_layers,
                  num_heads=num_heads, mlp_dim=mlp_dim, max_len=max_len, dropout=dropout,
                  scan=scan, remat_policy=remat_policy)
    opts = dict(batch_size=batch_size, seq_len=seq_len, vocab_size=vocab_size, hidden=hidden,
                num_layers=num_layers, num_heads=num_heads, mlp_dim=mlp_dim, max_len=max_len,
                dropout=dropout, seed=seed, scan=scan)
    return build_spec("gpt2_small", module, batch, input_key="tokens",
                      objective=lambda logits, b: softmax_xent(logits, b["targets"]),
                      seed=seed, abstract=abstract, options=opts, init=init)
