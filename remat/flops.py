"""FLOP model for Jaxpr equations.

Counting rules (one execution of the equation, in floating-point operations):

* ``dot_general``: ``2 * MACs`` = ``2 * size(out) * prod(contracting dims)`` (batch dims are part of
  ``out``).
* ``conv_general_dilated``: ``2 * MACs`` with only the *valid* (non-padding, non-hole) input
  positions counted, as XLA's ``HloCostAnalysis`` does:
  ``MACs = batch_out * features_out * rhs_in_features * prod_d pairs_d`` where ``pairs_d`` is the
  number of (output position, kernel tap) pairs of spatial dimension ``d`` that land on a real
  input element.  This covers strides, padding, lhs/rhs dilation, feature groups and batch groups,
  hence the transposed convolutions JAX emits for the backward pass.
* elementwise (arithmetic, comparisons, transcendental, ``select_n``, ...): ``size(out)``, times
  a weight for the few ops that XLA expands into long instruction sequences (``ELEMENT_WEIGHT``:
  e.g. ``erfc`` 61, ``random_bits`` 47 per 32-bit word; each weight is XLA:CPU's
  ``HloCostAnalysis`` flops + transcendentals per element, measured on jax 0.10.2, and
  ``one_minus_square``'s 3 on jax 0.12);
  ``integer_pow`` by repeated squaring (``floor(log2|y|) + popcount|y| - 1`` multiplies, +1 divide
  for ``y < 0``).
* ``polynomial`` (jax >= 0.12, ``x`` and ``k`` coefficients): ``2 (k - 1)`` per output element
  (Horner's multiply-adds; ``2 k`` above its ``unroll`` threshold, where XLA runs a scan).
* reductions (``reduce_*``, ``argmax``, ``cumsum``, ...): ``size(input)``.
* windowed reductions (pooling) and their gradients: ``size(out) * window size``.
* data movement and metadata (``reshape``, ``transpose``, ``broadcast_in_dim``, ``gather``, ``pad``,
  ``dynamic_slice``, ``convert_element_type``, ``iota``, ...): 0.
* ``scatter-add`` style scatters: ``size(updates)``; plain ``scatter``: 0.
* ``scan``: body x ``length``; ``cond``: the most expensive branch; ``while``: one iteration of
  cond + body (the trip count is unknown statically).
* linear algebra (textbook operation counts, approximate): ``cholesky`` n^3/3, ``triangular_solve``
  m^2 k, ``lu`` ~2/3 n^3, ``qr`` 2mn^2 - 2/3 n^3, ``eigh``/``eig`` 9 n^3, ``svd`` 4mn^2 + 8n^3,
  ``fft`` 5 N log2 N per transform (all times the batch).

A primitive outside these tables (:func:`has_rule` false; a new JAX release adds some) gets the
conservative **fallback rule**, from its avals: one FLOP per output element; when no output has
an input's shape (not elementwise) it also touches its bytes in + out (:func:`fallback_bytes`,
which :func:`remat.extract` adds to the node's bytes moved).  A primitive that carries sub-jaxprs
(a new call-like primitive) costs its bodies instead, each once.  :func:`remat.extract` warns once
(:class:`~remat.core.errors.RematWarning`) and lists the names in ``graph.meta["unknown_primitives"]``;
:func:`unknown_primitives` lists them for any jaxpr.  Only an output without a static shape raises
:class:`~remat.core.errors.UnsupportedPrimitiveError`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from remat._jax_compat import (
    call_body,
    cond_branches,
    open_jaxpr,
    scan_params,
    summarize,
    while_parts,
)
from remat.core.errors import UnsupportedPrimitiveError

__all__ = ["eqn_flops", "jaxpr_flops", "conv_flops", "dot_flops", "FLOP_RULES", "where",
           "has_rule", "fallback_bytes", "primitive_names", "unknown_primitives"]

ZERO = frozenset(
    """
    reshape broadcast_in_dim transpose squeeze expand_dims convert_element_type bitcast_convert_type
    slice dynamic_slice dynamic_update_slice gather concatenate pad rev iota copy copy_p device_put
    name optimization_barrier random_wrap random_unwrap random_seed random_key_data stop_gradient
    split sharding_constraint mesh_cast reshard pvary broadcast zeros_like full_like
    tie_in axis_index create_token after_all debug_callback squeeze_p real_p scatter
    platform_index empty pure_callback io_callback empty2 empty_ref broadcast_to tile stack unstack
    iota_2x32_shape layout_constraint with_memory_space_constraint pin unpin random_clone from_edtype
    to_edtype shape_assertion dim_as_value dimension_size inspect_sharding debug_print tie freeze
    check dce_sink pbroadcast reduced_vary_cast_p vary_unreduced_cast_p all_gather all_to_all
    ppermute get swap unreachable
    """.split()
)

ELEMENTWISE = frozenset(
    """
    add sub mul div rem pow max min neg sign floor ceil round is_finite abs exp exp2 log log1p
    expm1 tanh logistic sin cos tan asin acos atan atan2 sinh cosh asinh acosh atanh sqrt rsqrt
    cbrt erf erfc erf_inv lgamma digamma igamma igammac igamma_grad_a random_gamma_grad
    bessel_i0e bessel_i1e regularized_incomplete_beta polygamma zeta integer_pow select_n clamp
    eq ne lt le gt ge and or not xor shift_left shift_right_logical shift_right_arithmetic
    population_count clz nextafter square reciprocal add_any conj real imag complex
    reduce_precision threefry2x32 random_bits random_fold_in random_split tan mulhi eq_to le_to
    lt_to threefry4x32 philox2x32 philox4x32 rng_uniform rng_bit_generator random_gamma psum pmax
    pmin addupdate one_minus_square polynomial
    """.split()
)

# FLOPs per output element of ops XLA expands (flops + transcendentals of HloCostAnalysis)
ELEMENT_WEIGHT = {
    "erfc": 61.0,
    "erf_inv": 39.0,
    "lgamma": 56.0,
    "digamma": 76.0,
    "logistic": 4.0,
    "asin": 7.0,
    "acos": 7.0,
    "sinh": 13.0,
    "cosh": 13.0,
    "random_bits": 47.0,
    "threefry2x32": 23.5,
    "one_minus_square": 3.0,  # lowered as (1 + x) * (1 - x) (jax >= 0.12)
}

REDUCTION = frozenset(
    """
    reduce_sum reduce_max reduce_min reduce_prod reduce_and reduce_or reduce_xor argmax argmin
    cumsum cumprod cummax cummin cumlogsumexp reduce reduce_and reduce_or approx_top_k
    """.split()
)

WINDOWED = frozenset(
    """
    reduce_window_sum reduce_window_max reduce_window_min reduce_window select_and_scatter_add
    select_and_gather_add select_and_scatter
    """.split()
)


def _size(aval) -> int:
    shape = getattr(aval, "shape", ())
    return int(math.prod(shape))


def dot_flops(lhs_shape, rhs_shape, dimension_numbers) -> float:
    """``2 * MACs`` of a ``dot_general``: ``2 * batch * lhs_free * rhs_free * contracting``."""
    (lc, rc), (lb, rb) = dimension_numbers
    contract = math.prod(lhs_shape[d] for d in lc)
    batch = math.prod(lhs_shape[d] for d in lb)
    lfree = math.prod(s for d, s in enumerate(lhs_shape) if d not in lc and d not in lb)
    rfree = math.prod(s for d, s in enumerate(rhs_shape) if d not in rc and d not in rb)
    return 2.0 * batch * lfree * rfree * contract


def _valid_pairs(n_in: int, k: int, n_out: int, stride: int, pad_lo: int, ldil: int, rdil: int) -> int:
    """Number of (output position, kernel tap) pairs of one spatial dim hitting a real input."""
    o = np.arange(n_out, dtype=np.int64)[:, None]
    t = np.arange(k, dtype=np.int64)[None, :]
    x = o * stride + t * rdil - pad_lo
    ok = (x >= 0) & (x <= (n_in - 1) * ldil) & (x % ldil == 0)
    return int(ok.sum())


def conv_flops(lhs_shape, rhs_shape, out_shape, params: dict[str, Any]) -> float:
    """``2 * MACs`` of a ``conv_general_dilated`` counting only valid input positions (XLA's rule)."""
    dn = params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    nsp = len(lhs_spec) - 2
    strides = params.get("window_strides") or (1,) * nsp
    padding = params.get("padding") or ((0, 0),) * nsp
    ldil = params.get("lhs_dilation") or (1,) * nsp
    rdil = params.get("rhs_dilation") or (1,) * nsp
    pairs = 1
    for d in range(nsp):
        pairs *= _valid_pairs(
            int(lhs_shape[lhs_spec[2 + d]]),
            int(rhs_shape[rhs_spec[2 + d]]),
            int(out_shape[out_spec[2 + d]]),
            int(strides[d]),
            int(padding[d][0]),
            int(ldil[d]),
            int(rdil[d]),
        )
    batch_out = int(out_shape[out_spec[0]])
    feat_out = int(out_shape[out_spec[1]])
    rhs_in = int(rhs_shape[rhs_spec[1]])
    return 2.0 * batch_out * feat_out * rhs_in * pairs


def where(eqn) -> str:
    """Human-readable origin of an equation: source line plus name stack."""
    try:

        src = summarize(eqn.source_info)
    except Exception:  # pragma: no cover - private API drift
        src = "<unknown source>"
    stack = str(getattr(eqn.source_info, "name_stack", ""))
    return f"{src} [{stack}]" if stack else src


def jaxpr_flops(jaxpr) -> float:
    """Total FLOPs of a (closed or open) jaxpr, recursing into sub-jaxprs."""

    return float(sum(eqn_flops(e) for e in open_jaxpr(jaxpr).eqns))


def _scan(e) -> float:

    sp = scan_params(e)
    return jaxpr_flops(sp.jaxpr) * sp.length


def _cond(e) -> float:

    return max((jaxpr_flops(b) for b in cond_branches(e)), default=0.0)


def _while(e) -> float:

    cond, body, _, _ = while_parts(e)
    return jaxpr_flops(cond) + jaxpr_flops(body)


def _call(key: str) -> Callable:
    def rule(e) -> float:

        return jaxpr_flops(call_body(e, key))

    return rule


def _dot(e) -> float:
    return dot_flops(e.invars[0].aval.shape, e.invars[1].aval.shape, e.params["dimension_numbers"])


def _conv(e) -> float:
    return conv_flops(
        e.invars[0].aval.shape, e.invars[1].aval.shape, e.outvars[0].aval.shape, e.params
    )


def _window(e) -> float:
    dims = e.params.get("window_dimensions")
    w = math.prod(dims) if dims else 1
    # select_and_scatter_add's output has the operand's shape: count over the source grid
    ref = e.invars[0].aval if e.primitive.name.startswith("select_and_scatter") else e.outvars[0].aval
    return float(_size(ref) * w)


def _scatter_add(e) -> float:
    upd = e.invars[2].aval if len(e.invars) > 2 else e.outvars[0].aval
    return float(_size(upd))


def _sort(e) -> float:
    n = _size(e.invars[0].aval)
    dim = e.params.get("dimension", -1)
    m = e.invars[0].aval.shape[dim] if e.invars[0].aval.shape else 1
    return float(n * max(1.0, math.log2(max(m, 2))))


def _integer_pow(e) -> float:
    y = int(e.params["y"])
    a = abs(y)
    muls = max(1, a.bit_length() - 1 + bin(a).count("1") - 1) if a > 1 else 1
    return float(_size(e.outvars[0].aval) * (muls + (1 if y < 0 else 0)))


def _random_bits(e) -> float:
    width = int(e.params.get("bit_width", 32))
    return float(_size(e.outvars[0].aval) * ELEMENT_WEIGHT["random_bits"] * max(1, width // 32))


def _batch_mn(aval) -> tuple[int, int, int]:
    shape = tuple(aval.shape)
    m, n = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, 1)
    return int(math.prod(shape[:-2])), int(m), int(n)


def _cholesky(e) -> float:
    b, n, _ = _batch_mn(e.invars[0].aval)
    return b * n**3 / 3.0


def _triangular_solve(e) -> float:
    b, m, _ = _batch_mn(e.invars[0].aval)
    k = _size(e.invars[1].aval) / max(b * m, 1)
    return b * m * m * k


def _lu(e) -> float:
    b, m, n = _batch_mn(e.invars[0].aval)
    k = min(m, n)
    return b * (m * n * k - (m + n) * k * k / 2.0 + k**3 / 3.0) * 2.0


def _qr(e) -> float:
    b, m, n = _batch_mn(e.invars[0].aval)
    k = min(m, n)
    return b * (2.0 * m * n * k - 2.0 * k**3 / 3.0 + 1.0)


def _eig(e) -> float:
    b, n, _ = _batch_mn(e.invars[0].aval)
    return b * 9.0 * n**3


def _svd(e) -> float:
    b, m, n = _batch_mn(e.invars[0].aval)
    k, big = min(m, n), max(m, n)
    return b * (4.0 * big * k * k + 8.0 * k**3)


def _fft(e) -> float:
    lengths = e.params.get("fft_lengths") or (1,)
    n = math.prod(lengths)
    transforms = _size(e.invars[0].aval) / max(n, 1)
    return 5.0 * transforms * n * math.log2(max(n, 2))


def _top_k(e) -> float:
    return float(_size(e.invars[0].aval))


def _polynomial(e) -> float:
    """Horner over ``k`` coefficients: ``k - 1`` multiply-adds per output element, unrolled up to
    ``unroll`` (default 8) coefficients; above it a scan from zero does ``k``."""
    k = len(e.invars) - 1
    unrolled = k <= (e.params.get("unroll") or 8)
    return 2.0 * (k - 1 if unrolled else k) * sum(_size(v.aval) for v in e.outvars)


FLOP_RULES: dict[str, Callable] = {
    "dot_general": _dot,
    "conv_general_dilated": _conv,
    "scan": _scan,
    "cond": _cond,
    "while": _while,
    "jit": _call("jaxpr"),
    "pjit": _call("jaxpr"),
    "closed_call": _call("call_jaxpr"),
    "core_call": _call("call_jaxpr"),
    "custom_jvp_call": _call("call_jaxpr"),
    "custom_vjp_call": _call("call_jaxpr"),
    "custom_vjp_call_jaxpr": _call("fun_jaxpr"),
    "remat2": _call("jaxpr"),
    "checkpoint": _call("jaxpr"),
    "custom_lin": lambda e: 0.0,
    "custom_jvp_call_jaxpr": _call("fun_jaxpr"),
    "composite": _call("jaxpr"),
    "custom_vmap_call": _call("call_jaxpr"),
    "cholesky": _cholesky,
    "triangular_solve": _triangular_solve,
    "lu": _lu,
    "qr": _qr,
    "geqrf": _qr,
    "geqp3": _qr,
    "householder_product": _qr,
    "ormqr": _qr,
    "eigh": _eig,
    "eig": _eig,
    "schur": _eig,
    "hessenberg": _eig,
    "svd": _svd,
    "fft": _fft,
    "scatter-add": _scatter_add,
    "scatter_add": _scatter_add,
    "scatter-mul": _scatter_add,
    "scatter_mul": _scatter_add,
    "scatter-min": _scatter_add,
    "scatter_min": _scatter_add,
    "scatter-max": _scatter_add,
    "scatter_max": _scatter_add,
    "scatter_sub": _scatter_add,
    "scatter-sub": _scatter_add,
    "sort": _sort,
    "integer_pow": _integer_pow,
    "random_bits": _random_bits,
    "top_k": _top_k,
    "polynomial": _polynomial,
}


def has_rule(name: str) -> bool:
    """Whether primitive ``name`` has a FLOP rule of its own (else the fallback rule costs it)."""
    return (name in FLOP_RULES or name in ZERO or name in ELEMENTWISE or name in REDUCTION
            or name in WINDOWED)


def _sub_jaxprs(eqn) -> list:
    """Every jaxpr (open or closed, as an open one) among ``eqn.params``, also inside tuples and
    lists (``cond`` branches)."""
    out = []
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            j = getattr(x, "jaxpr", x)
            if hasattr(j, "eqns"):
                out.append(j)
    return out


def _eqns(jaxpr):
    j = getattr(jaxpr, "jaxpr", jaxpr)
    return j.eqns if hasattr(j, "eqns") else jaxpr


def primitive_names(jaxpr) -> set[str]:
    """Names of the primitives of a jaxpr (open or closed) or a sequence of equations, sub-jaxprs
    included."""
    names: set[str] = set()
    for e in _eqns(jaxpr):
        names.add(e.primitive.name)
        for j in _sub_jaxprs(e):
            names |= primitive_names(j)
    return names


def unknown_primitives(jaxpr) -> tuple[str, ...]:
    """Sorted names of the primitives of ``jaxpr`` (as :func:`primitive_names`) that have no rule
    and are costed by the fallback rule."""
    return tuple(sorted(n for n in primitive_names(jaxpr) if not has_rule(n)))


def _static(aval) -> bool:
    shape = getattr(aval, "shape", None)
    return shape is not None and all(isinstance(d, (int, np.integer)) for d in shape)


def _elementwise(eqn) -> bool:
    """An output has the shape of an input."""
    ins = {tuple(getattr(v.aval, "shape", ())) for v in eqn.invars}
    return any(tuple(getattr(v.aval, "shape", ())) in ins for v in eqn.outvars)


def _nbytes(aval) -> float:
    return float(_size(aval) * getattr(getattr(aval, "dtype", None), "itemsize", 4))


def _fallback(eqn) -> float:
    """FLOPs of a primitive without a rule: its bodies (each once) when it carries sub-jaxprs,
    else one per output element."""
    subs = _sub_jaxprs(eqn)
    if subs:
        return float(sum(jaxpr_flops(j) for j in subs))
    if not all(_static(v.aval) for v in eqn.outvars):
        raise UnsupportedPrimitiveError(
            eqn.primitive.name, where(eqn),
            "no FLOP rule in remat.flops and no static output shape for the fallback rule")
    return float(sum(_size(v.aval) for v in eqn.outvars))


def fallback_bytes(eqn) -> float:
    """Bytes touched by the fallback-costed equations in ``eqn`` beyond what its node's boundary
    shows: in + out bytes of each one that is not elementwise (sub-jaxprs included: a ``scan``
    body times its length, the largest ``cond`` branch, one ``while`` iteration).  0 when every
    primitive has a rule."""
    name = eqn.primitive.name
    subs = _sub_jaxprs(eqn)
    if not subs:
        if has_rule(name) or _elementwise(eqn):
            return 0.0
        return sum(_nbytes(v.aval) for v in (*eqn.invars, *eqn.outvars))
    per = [sum(fallback_bytes(e) for e in j.eqns) for j in subs]
    if name == "cond":
        return max(per)
    return sum(per) * (int(eqn.params.get("length", 1)) if name == "scan" else 1)


def eqn_flops(eqn) -> float:
    """FLOPs of one equation (see the module docstring for the rules; a primitive without a rule
    gets the fallback rule).

    Raises:
      UnsupportedPrimitiveError: the primitive has no rule and an output has no static shape;
        the message names where it came from.
    """
    name = eqn.primitive.name
    rule = FLOP_RULES.get(name)
    if rule is not None:
        return float(rule(eqn))
    if name in ZERO:
        return 0.0
    if name in ELEMENTWISE:
        return float(sum(_size(v.aval) for v in eqn.outvars)) * ELEMENT_WEIGHT.get(name, 1.0)
    if name in REDUCTION:
        return float(_size(eqn.invars[0].aval))
    if name in WINDOWED:
        return _window(eqn)
    return _fallback(eqn)
