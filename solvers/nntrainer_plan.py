"""NNTrainer's execution-order memory planning (Moon et al., ICSE-SEIP 2024), numpy only.

Three parts, on the interfaces of :mod:`remat.core.layout` (lifetimes and sizes in, offsets out):

* **Execution orders** (the paper's Algorithm 1, made consistent as follows):
  :func:`execution_orders` gives every layer ``i`` of an ``N``-layer chain the integer EOs of its
  four fine-grained steps, forward ``F = i`` and, with the backward index reversed
  (``r = N - 1 - i``), compute-gradient ``CG = N + 3r``, compute-derivative ``CD = CG + 1``,
  apply-gradient ``AG = CG + 2`` (so EOs cover ``0 .. 4N - 1``).  A non-trainable layer runs CD
  only: ``CG = CD = AG = N + 3r``.  With gradient clipping ``CG = N + 2r``, ``CD = CG + 1``,
  ``AG = 3N + i`` (every CG before any AG).
* **Tensor lifespans** of a layer chain given as arrays (:class:`LayerChain`): inputs/outputs
  ``X_j``, derivatives ``D_j`` (gradient w.r.t. ``X_j``), weights ``W_i``, weight gradients
  ``dW_i``, each with the set of EOs that touch it (NNTrainer's tensor request rules), then
  the **in-place / view merges**: the output of an elementwise in-place layer (ReLU, sigmoid:
  ``INPLACE``, NNTrainer's modify-view) shares its input's slot when the input is not read after
  the in-place op (``min EO(out) >= max EO(in)``), and so does its derivative; the output of a
  view layer (flatten, reshape: ``VIEW``, read-only view) always shares its input's slot.  A
  merged tensor lives over the convex hull of its EOs (NNTrainer's ``[min EO, max EO]``; holes
  are what swapping exploits) and is as large as its largest member.  :func:`lifespans`.
* **Planners** as :data:`remat.core.layout.Placement` functions ``(intervals, sizes) -> offsets``:
  :func:`basic` (no reuse: the arena is the sum of sizes, NNTrainer's ``BasicPlanner``),
  :func:`optimized_v1` (NNTrainer's default ``OptimizedV1Planner``: by start, a stack of live
  slots, exact-size reuse of an expired slot, else on top), :func:`optimized_v3` (by start, the
  first gap among live blocks: ``OptimizedV3Planner``) and :func:`remat.core.layout.first_fit`;
  the theoretical lower bound is :func:`remat.core.layout.max_live_lower_bound` (NNTrainer's
  ``calcMinMemoryRequirement``).  The first three are registered in
  :data:`remat.core.layout.PLACEMENTS` as ``"nntrainer_basic"``, ``"nntrainer_v1"``,
  ``"nntrainer_v3"``.

Swap timing (proactive vs on-demand) is :func:`swap_latency`: a two-stream (read, write) I/O
model over steps, used by :mod:`policies.nntrainer`.

Units: sizes and offsets in bytes, EOs and steps are integer indices, times in seconds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from remat.core.layout import PLACEMENTS, first_fit, max_live_lower_bound, place

__all__ = [
    "WEIGHTED",
    "INPLACE",
    "VIEW",
    "OTHER",
    "POOL",
    "F",
    "CG",
    "CD",
    "AG",
    "LayerChain",
    "Tensors",
    "execution_orders",
    "lifespans",
    "residency",
    "basic",
    "optimized_v1",
    "optimized_v3",
    "PLANNERS",
    "planner_table",
    "swap_latency",
]

#: layer kinds of a :class:`LayerChain`
WEIGHTED, INPLACE, VIEW, OTHER, POOL = 0, 1, 2, 3, 4
#: columns of :func:`execution_orders`
F, CG, CD, AG = 0, 1, 2, 3


class LayerChain(NamedTuple):
    """A chain of ``N`` layers ``X_{i+1} = L_i(X_i)`` as arrays.

    Attributes:
      in_bytes: bytes of the chain's input ``X_0`` (a place-holder).
      out_bytes: ``int64[N]`` bytes of each layer's output ``X_{i+1}`` (and of its derivative).
      weight_bytes: ``int64[N]`` bytes of each layer's weights (0: weight-free).
      kind: ``int8[N]``: :data:`WEIGHTED` (conv, linear: its CG reads ``X_i``), :data:`INPLACE`
        (elementwise activation whose backward needs only its output: modify-view of its input),
        :data:`VIEW` (flatten/reshape: read-only view), :data:`OTHER` (its CD reads ``X_i``,
        e.g. JAX's max-pool backward), :data:`POOL` (max-pool keeping its argmax, NNTrainer's
        ``pool_helper``: an index tensor ``I_i`` as large as the output, written at F, read at
        CD; ``X_i`` is then not kept).
      trainable: ``bool[N]`` or None (default: all).  A non-trainable layer runs CD only (one
        EO for CG, CD, AG), neither keeps ``X_i`` for a CG nor has ``dW_i``.  Weight-free layers
        stay trainable (the sigmoid of the paper's Fig. 5 has its own CD).
    """

    in_bytes: int
    out_bytes: np.ndarray
    weight_bytes: np.ndarray
    kind: np.ndarray
    trainable: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.out_bytes)

    def trainable_array(self) -> np.ndarray:
        """``bool[N]``: the trainable layers (separate CG, CD and AG EOs)."""
        if self.trainable is None:
            return np.ones(self.n, dtype=bool)
        return np.asarray(self.trainable, dtype=bool).reshape(self.n)


class Tensors(NamedTuple):
    """Tensor requests of a chain after the merges (one row per memory slot).

    Attributes:
      names: name of each merged tensor (its root, e.g. ``"X1"``; members in ``members``).
      members: the names merged into each slot.
      eos: sorted ``int64`` EO arrays: every EO that touches the slot.
      intervals: ``int64[T, 2]`` inclusive ``[min EO, max EO]``.
      sizes: ``int64[T]`` bytes.
      is_weight: ``bool[T]``: weights and weight gradients (NNTrainer's weight pool).
    """

    names: list[str]
    members: list[list[str]]
    eos: list[np.ndarray]
    intervals: np.ndarray
    sizes: np.ndarray
    is_weight: np.ndarray


def execution_orders(n: int, trainable: Any = None, *, grad_clip: bool = False) -> np.ndarray:
    """Algorithm 1's EOs (Moon et al. 2024), backward index reversed.

    Args:
      n: number of layers ``N``.
      trainable: ``bool[N]`` (default all); a non-trainable layer gets one EO for CG, CD, AG.
      grad_clip: every CG/CD first (``N + 2r``), then every AG (``3N + i``).

    Returns:
      ``int64[N, 4]``: columns :data:`F`, :data:`CG`, :data:`CD`, :data:`AG`.
    """
    i = np.arange(n, dtype=np.int64)
    r = n - 1 - i
    tr = np.ones(n, bool) if trainable is None else np.asarray(trainable, dtype=bool)
    eo = np.empty((n, 4), dtype=np.int64)
    eo[:, F] = i
    if grad_clip:
        eo[:, CG] = n + 2 * r
        eo[:, CD] = eo[:, CG] + 1
        eo[:, AG] = 3 * n + i
    else:
        eo[:, CG] = n + 3 * r
        eo[:, CD] = eo[:, CG] + 1
        eo[:, AG] = eo[:, CG] + 2
    eo[~tr, CD] = eo[~tr, CG]
    eo[~tr, AG] = eo[~tr, CG]
    return eo


def lifespans(chain: LayerChain, *, grad_clip: bool = False, merge: bool = True) -> Tensors:
    """The merged tensors of ``chain`` with their EOs, lifetimes and sizes.

    Request rules (NNTrainer's): ``X_j`` is touched by its producer's F, its consumer's F, the
    consumer's CG (trainable :data:`WEIGHTED`) or CD (:data:`OTHER`), and the producer's CD when
    the producer is :data:`INPLACE` (its backward reads its output); the chain output ``X_N``
    also by the loss at EO ``N``.  ``D_j`` (gradient w.r.t. ``X_j``, ``j >= 1``) is written at
    layer ``j``'s CD (by the loss at EO ``N`` for ``D_N``) and read at CG and CD of layer
    ``j - 1``.  ``W_i`` lives over every EO; ``dW_i`` over ``{CG_i, AG_i}`` (to the last EO with
    ``grad_clip``); a :data:`POOL` layer's index ``I_i`` over ``{F_i, CD_i}``.  Merges
    (``merge=True``): X's in forward order, D's in backward order, an
    :data:`INPLACE` layer's output (derivative: input derivative) joins its input (output
    derivative) when ``min EO(new) >= max EO(target)``; a :data:`VIEW` layer's always do.
    """
    n = chain.n
    kind = np.asarray(chain.kind)
    out = np.asarray(chain.out_bytes, dtype=np.int64)
    wb = np.asarray(chain.weight_bytes, dtype=np.int64)
    tr = chain.trainable_array()
    eo = execution_orders(n, tr, grad_clip=grad_clip)
    last = int(eo.max()) if n else 0
    names: list[str] = []
    sets: list[set[int]] = []
    size: list[int] = []
    weight: list[bool] = []

    def add(name: str, s: set[int], b: int, w: bool = False) -> int:
        names.append(name)
        sets.append(s)
        size.append(int(b))
        weight.append(w)
        return len(names) - 1

    X = []
    for j in range(n + 1):
        s: set[int] = set()
        if j > 0:
            s.add(int(eo[j - 1, F]))
            if kind[j - 1] == INPLACE:
                s.add(int(eo[j - 1, CD]))
        if j < n:
            s.add(int(eo[j, F]))
            if kind[j] == WEIGHTED and tr[j]:
                s.add(int(eo[j, CG]))
            elif kind[j] == OTHER:
                s.add(int(eo[j, CD]))
        else:
            s.add(n)  # the loss reads the output at the first backward EO
        X.append(add(f"X{j}", s, chain.in_bytes if j == 0 else out[j - 1]))
    D = [-1] * (n + 1)
    for j in range(n, 0, -1):
        s = {n} if j == n else {int(eo[j, CD])}
        s |= {int(eo[j - 1, CG]), int(eo[j - 1, CD])}
        D[j] = add(f"D{j}", s, out[j - 1])
    for i in range(n):
        if kind[i] == POOL:
            add(f"I{i}", {int(eo[i, F]), int(eo[i, CD])}, out[i])
        if wb[i] > 0:
            add(f"W{i}", set(range(last + 1)), wb[i], True)
            if tr[i]:
                add(f"dW{i}", {int(eo[i, CG]), last if grad_clip else int(eo[i, AG])}, wb[i], True)

    parent = list(range(len(names)))

    def root(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    def join(new: int, target: int, conditional: bool) -> None:
        a, b = root(new), root(target)
        if a == b or (conditional and min(sets[a]) < max(sets[b])):
            return
        parent[a] = b
        sets[b] |= sets[a]
        size[b] = max(size[b], size[a])

    if merge:
        for j in range(n):  # forward: X_{j+1} into X_j
            if kind[j] in (INPLACE, VIEW):
                join(X[j + 1], X[j], kind[j] == INPLACE)
        for j in range(n - 1, 0, -1):  # backward: D_j (input derivative) into D_{j+1}
            if kind[j] in (INPLACE, VIEW):
                join(D[j], D[j + 1], kind[j] == INPLACE)
    roots = [a for a in range(len(names)) if root(a) == a]
    members = {a: [] for a in roots}
    for a in range(len(names)):
        members[root(a)].append(names[a])
    e = [np.array(sorted(sets[a]), dtype=np.int64) for a in roots]
    iv = np.array([[x[0], x[-1]] for x in e], dtype=np.int64).reshape(-1, 2)
    return Tensors([names[a] for a in roots], [members[a] for a in roots], e, iv,
                   np.array([size[a] for a in roots], dtype=np.int64),
                   np.array([weight[a] for a in roots], dtype=bool))


def residency(chain: LayerChain, *, grad_clip: bool = False) -> np.ndarray:
    """Bytes a step needs resident at each EO: the merged tensors (:func:`lifespans`) whose EO
    set contains it, a weight ``W_i`` only at its own layer's EOs (``F, CG, CD, AG``).

    With whole-tensor swapping and no recomputation nothing less can be resident at that EO, so
    the maximum is the lower bound of any swap schedule (the paper's "theoretical" residency,
    32.14 MiB at ``c2:CD`` of its VGG16, Sec. 5.2).

    Returns:
      ``int64[E]`` bytes per EO, ``E = max EO + 1``.
    """
    t = lifespans(chain, grad_clip=grad_clip)
    eo = execution_orders(chain.n, chain.trainable_array(), grad_clip=grad_clip)
    out = np.zeros(int(eo.max(initial=-1)) + 1, dtype=np.int64)
    for name, e, size in zip(t.names, t.eos, t.sizes.tolist()):
        if name.startswith("W"):
            e = np.unique(eo[int(name[1:])])
        out[np.unique(e)] += size
    return out


# ------------------------------------------------------------------------------- planners
def basic(intervals: Any, sizes: Any) -> np.ndarray:
    """NNTrainer's ``BasicPlanner``: no sharing, ``offset_i = sum_{k<i} size_k`` (bytes)."""
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    return np.concatenate([[0], np.cumsum(s)[:-1]]).astype(np.int64) if len(s) else s.copy()


def optimized_v1(intervals: Any, sizes: Any) -> np.ndarray:
    """NNTrainer's ``OptimizedV1Planner``, on inclusive lifetimes.

    Requests by (start, end) ascending; a stack of slots ordered by offset; before each request
    the expired slots on top are popped; then the highest expired slot of *exactly* the request's
    size is reused (its occupant replaced); otherwise the request goes on top of the stack.

    Args:
      intervals: ``int64[A, 2]`` inclusive ``[first, last]`` (EOs or events).
      sizes: ``int64[A]`` bytes.

    Returns:
      ``int64[A]`` offsets (bytes); a valid layout (slots on the stack are disjoint).
    """
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    off = np.zeros(len(s), dtype=np.int64)
    stack: list[list[int]] = []  # [offset, size, last]
    for a in np.lexsort((iv[:, 1], iv[:, 0])).tolist():
        start, end, size = int(iv[a, 0]), int(iv[a, 1]), int(s[a])
        if size == 0:
            continue
        while stack and stack[-1][2] < start:
            stack.pop()
        for slot in reversed(stack):
            if slot[2] < start and slot[1] == size:
                off[a] = slot[0]
                slot[2] = end
                break
        else:
            off[a] = stack[-1][0] + stack[-1][1] if stack else 0
            stack.append([int(off[a]), size, end])
    return off


def optimized_v3(intervals: Any, sizes: Any) -> np.ndarray:
    """NNTrainer's ``OptimizedV3Planner``: (start, end) ascending, each in the lowest gap among
    the live blocks that fits (bytes)."""
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    return place(iv, sizes, np.lexsort((iv[:, 1], iv[:, 0])), fit="first")


PLACEMENTS.setdefault("nntrainer_basic", basic)
PLACEMENTS.setdefault("nntrainer_v1", optimized_v1)
PLACEMENTS.setdefault("nntrainer_v3", optimized_v3)

PLANNERS = {"basic": basic, "optimized_v1": optimized_v1, "optimized_v3": optimized_v3,
            "first_fit": first_fit}
"""The planners of the comparison, by the names used in reports."""


def planner_table(intervals: Any, sizes: Any) -> dict[str, int]:
    """Arena bytes of every planner in :data:`PLANNERS` and ``"bound"`` (max live bytes)."""
    s = np.asarray(sizes, dtype=np.int64).reshape(-1)
    out = {k: int((np.asarray(fn(intervals, s)) + s).max(initial=0)) for k, fn in PLANNERS.items()}
    out["bound"] = max_live_lower_bound(intervals, s)
    return out


# --------------------------------------------------------------------------- swap timing
def swap_latency(compute_s: Any, reads: Any, writes: Any) -> float:
    """Modelled time (s) of a step sequence with paging on two I/O streams (read, write).

    Each stream serves its transfers one at a time in issue order; compute runs step after
    step.  A transfer issued at step ``u`` starts once step ``u`` starts and its stream is free;
    step ``t`` cannot start its compute until every transfer due at ``t`` has finished (a read:
    the value is needed; a write: its device copy is freed there).  A transfer with
    ``issue == due`` is synchronous (on-demand: the step waits for all of it).

    Args:
      compute_s: ``float[T]`` compute time of each step (s).
      reads, writes: ``(issue int[R], due int[R], seconds float[R])`` each.

    Returns:
      End time of the last step (s).
    """
    c = np.asarray(compute_s, dtype=np.float64).reshape(-1)
    streams = []
    for issue, due, dur in (reads, writes):
        issue = np.asarray(issue, dtype=np.int64).reshape(-1)
        due = np.asarray(due, dtype=np.int64).reshape(-1)
        dur = np.asarray(dur, dtype=np.float64).reshape(-1)
        order = np.lexsort((due, issue))
        streams.append((issue[order], due[order], dur[order], [0.0] * len(order)))
    clock = 0.0
    nxt = [0, 0]
    free = [0.0, 0.0]
    pending: list[list[tuple[int, int]]] = [[] for _ in range(len(c) + 1)]
    for t in range(len(c)):
        for k, (issue, due, dur, done) in enumerate(streams):
            while nxt[k] < len(issue) and issue[nxt[k]] <= t:
                j = nxt[k]
                free[k] = max(free[k], clock) + float(dur[j])
                done[j] = free[k]
                pending[min(int(due[j]), len(c))].append((k, j))
                nxt[k] += 1
        for k, j in pending[t]:
            clock = max(clock, streams[k][3][j])
        clock += float(c[t])
    for k, j in pending[len(c)]:
        clock = max(clock, streams[k][3][j])
    return float(clock)
