"""One look for every figure: a fixed colour and marker per policy, unit-labelled axes, points
that coincide told apart, paging cost drawn next to compute, and per-policy memory timelines.

Figure scripts, the ``remat`` CLI and the notebooks import this module so that ``chain_dp`` is the
same orange square in every figure.  Nothing here computes results; every function draws rows or
:class:`remat.Report` objects that the caller made.

Units: memory on axes is MiB (``2**20`` bytes), time seconds, energy joules; graphs loaded from
JSON carry their own cost units instead of seconds (callers pass ``time_unit``).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

MIB = float(2**20)

_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<", ">", "p", "d", "8", "H")

#: ``policy name -> {"color", "marker"}`` for every policy the project ships (Tableau-20
#: colours, one marker each); :func:`style` gives any other name a stable fallback.
POLICY_STYLES: dict[str, dict[str, Any]] = {
    "checkpoint_all": {"color": "#7f7f7f", "marker": "o"},
    "recompute_all": {"color": "#c7c7c7", "marker": "X"},
    "jax_policy": {"color": "#bcbd22", "marker": "h"},
    "sqrtn": {"color": "#1f77b4", "marker": "^"},
    "griewank": {"color": "#aec7e8", "marker": "v"},
    "chain_dp": {"color": "#ff7f0e", "marker": "s"},
    "checkmate": {"color": "#d62728", "marker": "D"},
    "poet": {"color": "#2ca02c", "marker": "P"},
    "melon": {"color": "#9467bd", "marker": "p"},
    "sage": {"color": "#8c564b", "marker": "<"},
    "olla": {"color": "#e377c2", "marker": "*"},
    "nntrainer": {"color": "#17becf", "marker": ">"},
    "greedy_remat": {"color": "#ffbb78", "marker": "d"},
    "pebbling": {"color": "#98df8a", "marker": "8"},
    "peak_shave": {"color": "#c5b0d5", "marker": (6, 1, 0)},  # a filled six-point star
    "scan_layers": {"color": "#ff9896", "marker": "H"},
    "hierarchical": {"color": "#000000", "marker": (5, 1, 0)},  # a five-point star
}

_FALLBACK_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d")


def style(name: str) -> dict[str, str]:
    """``{"color": hex, "marker": matplotlib marker}`` for policy ``name``: the fixed entry of
    :data:`POLICY_STYLES`, else one chosen by a hash of the name (stable across runs/figures)."""
    if name in POLICY_STYLES:
        return dict(POLICY_STYLES[name])
    h = zlib.crc32(name.encode())
    return {"color": _FALLBACK_COLORS[h % len(_FALLBACK_COLORS)],
            "marker": _MARKERS[(h // 7) % len(_MARKERS)]}


def _union_groups(x: np.ndarray, y: np.ndarray, tx: float, ty: float) -> list[list[int]]:
    """Connected components of "within ``tx`` in x and ``ty`` in y", in input order."""
    n = len(x)
    parent = list(range(n))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if abs(x[i] - x[j]) <= tx and abs(y[i] - y[j]) <= ty:
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def coincident_groups(xs: Sequence[float], ys: Sequence[float], rtol: float = 1e-6) -> list[list[int]]:
    """Indices of points with the same value: ``i`` and ``j`` share a group when
    ``|x_i - x_j| <= rtol * max|x|`` and the same in ``y``, transitively (input order kept)."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if not len(x):
        return []
    return _union_groups(x, y, rtol * max(float(np.abs(x).max()), 1e-300),
                         rtol * max(float(np.abs(y).max()), 1e-300))


def overlapping_groups(ax, xs: Sequence[float], ys: Sequence[float], min_sep_pt: float = 9.0
                       ) -> list[list[int]]:
    """Points (data coordinates of ``ax``, limits already set) whose markers would overlap:
    closer than ``min_sep_pt`` points on screen in both x and y, transitively."""
    if not len(xs):
        return []
    disp = ax.transData.transform(np.column_stack([np.asarray(xs, float), np.asarray(ys, float)]))
    tol = min_sep_pt * ax.figure.dpi / 72.0
    return _union_groups(disp[:, 0], disp[:, 1], tol, tol)


def scatter_policies(ax, names: Sequence[str], xs: Sequence[float], ys: Sequence[float], *,
                     sizes: Sequence[float] | None = None, min_sep_pt: float = 9.0
                     ) -> list[list[int]]:
    """Scatter one point per policy in its style.  Markers that would overlap on screen
    (:func:`overlapping_groups`) are stacked vertically about the group's centre, each at its
    exact x and tied to its true position (a black dot) by a thin leader line (x is memory:
    what the budget line is read against); a group of identical values
    (:func:`coincident_groups`) is annotated ``"n identical"``.  ``sizes``: marker areas (pt^2),
    default 60.  Returns the overlap groups (indices into ``names``)."""
    from matplotlib.transforms import offset_copy

    if not len(xs):
        return []
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    # offset transforms do not grow the data limits: set them from the true positions first,
    # with room for the stacked markers
    ax.update_datalim(np.column_stack([x, y]))
    ax.margins(0.15)
    ax.autoscale_view()
    pt = ax.figure.dpi / 72.0
    disp = ax.transData.transform(np.column_stack([x, y]))
    groups = overlapping_groups(ax, x, y, min_sep_pt)
    step = min_sep_pt + 1.0
    for grp in groups:
        # stack the group vertically about its centre, each marker at its own (exact) memory x,
        # in the order of the true overheads
        order = sorted(grp, key=lambda i: (y[i], grp.index(i)))
        centre_y = disp[grp, 1].mean()
        for rank, i in enumerate(order):
            dy = (centre_y + (rank - (len(grp) - 1) / 2) * step * pt - disp[i, 1]) / pt
            st = style(names[i])
            tr = offset_copy(ax.transData, fig=ax.figure, x=0.0, y=dy, units="points")
            ax.scatter([x[i]], [y[i]], s=60 if sizes is None else sizes[i], color=st["color"],
                       marker=st["marker"], edgecolor="k", linewidth=0.5, transform=tr,
                       label=names[i], zorder=3)
            if len(grp) > 1 and abs(dy) > 0.5:
                ax.annotate("", xy=(x[i], y[i]), xytext=(0.0, dy), textcoords="offset points",
                            arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.45"}, zorder=2)
        if len(grp) > 1:
            ax.scatter(x[grp], y[grp], s=5, color="k", zorder=4)
            same = [g for g in coincident_groups(x[grp], y[grp]) if len(g) > 1]
            if same:
                txt = "; ".join(f"{len(g)} identical" for g in same)
                i0 = grp[0]
                ax.annotate(txt, (x[i0], y[i0]), xytext=(0, -(8 + step * len(grp) / 2)),
                            textcoords="offset points", ha="center", va="top", fontsize=6,
                            color="0.3")
    return groups


def memory_vs_overhead(ax, names: Sequence[str], peak_bytes: Sequence[float],
                       overheads: Sequence[float], *, budget_bytes: float | None = None,
                       title: str | None = None, paged_bytes: Sequence[float] | None = None
                       ) -> list[list[int]]:
    """The comparison scatter: simulated peak activation memory (MiB) against compute overhead
    over checkpoint-all (x), one style per policy, overlapping plans stacked apart
    (:func:`scatter_policies`), the budget as a dashed line; a log overhead axis when the
    overheads span more than 2.5x (so recompute-all does not squash the rest).  ``paged_bytes``:
    plans that page (POET) are labelled with the bytes they move, since their overhead leaves
    the paging out.  Returns the overlap groups."""
    import matplotlib.ticker as mticker

    if budget_bytes is not None:
        ax.axvline(float(budget_bytes) / MIB, color="k", ls="--", lw=1, label="budget")
    groups: list[list[int]] = []
    if len(names):
        lo, hi = min(overheads), max(overheads)
        if hi > 2.5 * lo:
            ax.set_yscale("log")
            ticks = (1, 1.5, 2, 3, 5, 10, 20, 50, 100) if hi > 4 * lo else (1, 1.25, 1.5, 2, 3, 4)
            nice = [t for t in ticks if lo / 1.3 <= t <= hi * 1.3]
            ax.yaxis.set_major_locator(mticker.FixedLocator(nice))
            ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(mticker.NullFormatter())
        groups = scatter_policies(ax, names, [p / MIB for p in peak_bytes], overheads)
        for i, moved in enumerate(paged_bytes or ()):
            if moved:
                ax.annotate(f"{names[i]} pages {moved / MIB:.2f} MiB", (peak_bytes[i] / MIB, overheads[i]),
                            xytext=(-8, 10), textcoords="offset points", ha="right", fontsize=6,
                            color=style(names[i])["color"],
                            arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.5"})
        ax.legend(fontsize=6, ncol=2, loc="best")
    ax.set_xlabel("simulated peak activation memory (MiB)")
    ax.set_ylabel("compute overhead vs checkpoint-all (x)")
    if title:
        ax.set_title(title, fontsize=9)
    return groups


def cost_bars(ax, names: Sequence[str], compute: Sequence[float], paging: Sequence[float], *,
              unit: str, what: str = "modelled time", paged_bytes: Sequence[float] | None = None
              ) -> None:
    """Horizontal bars, one per policy: compute cost (solid, policy colour) with paging cost
    stacked after it (hatched), so a paging plan (POET) shows what it pays instead of
    recomputing.  ``paged_bytes``: annotate bars that page with the bytes moved (MiB)."""
    y = np.arange(len(names))
    comp = np.asarray(compute, dtype=np.float64)
    pag = np.asarray(paging, dtype=np.float64)
    cols = [style(n)["color"] for n in names]
    ax.barh(y, comp, color=cols, edgecolor="k", linewidth=0.4)
    ax.barh(y, pag, left=comp, color=cols, edgecolor="k", linewidth=0.4, hatch="////", alpha=0.6)
    for i in range(len(names)):
        moved = 0.0 if paged_bytes is None else float(paged_bytes[i])
        if moved > 0 or pag[i] > 0:
            ax.annotate(f"paging {pag[i]:.3g} {unit}" + (f", {moved / MIB:.2f} MiB moved" if moved else ""),
                        (comp[i] + pag[i], y[i]), xytext=(3, 0), textcoords="offset points",
                        va="center", fontsize=6)
    top = float((comp + pag).max()) if len(names) else 0.0
    if top > 0:  # the stacked bars' sticky edges would clip the longest bar; leave room for notes
        noted = pag.any() or (paged_bytes is not None and any(paged_bytes))
        ax.set_xlim(0, top * (1.45 if noted else 1.05))
    ax.set_yticks(y, list(names), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(f"{what} ({unit}); hatched: paging")


def plot_timelines(reports: Mapping[str, Any], *, budget_bytes: float | None = None,
                   ncols: int = 4, title: str | None = None, panel_size: tuple[float, float] = (2.6, 1.8)):
    """Small multiples of per-policy memory timelines: live activation MiB against compute event
    (``Report.timeline["live_bytes"]``), one panel per policy in its colour, shared y axis, the
    budget as a dashed line and each plan's peak in the panel title.  Returns the figure."""
    import matplotlib.pyplot as plt

    names = list(reports)
    n = max(len(names), 1)
    ncols = min(ncols, n)
    nrows = -(-n // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(panel_size[0] * ncols, panel_size[1] * nrows + 0.4),
                             sharey=True, squeeze=False)
    for k, ax in enumerate(axes.flat):
        if k >= len(names):
            ax.set_visible(False)
            continue
        name = names[k]
        rep = reports[name]
        live = np.asarray(rep.timeline["live_bytes"], dtype=np.float64) / MIB
        st = style(name)
        ax.plot(np.arange(len(live)), live, color=st["color"], lw=1.2)
        ax.fill_between(np.arange(len(live)), live, color=st["color"], alpha=0.2)
        if budget_bytes is not None:
            ax.axhline(budget_bytes / MIB, color="k", ls="--", lw=0.8)
        ax.set_title(f"{name}: peak {rep.peak_bytes / MIB:.2f} MiB, {rep.overhead:.2f}x", fontsize=7)
        ax.tick_params(labelsize=6)
        if k % ncols == 0:
            ax.set_ylabel("live activations (MiB)", fontsize=7)
        if k // ncols == nrows - 1 or k + ncols >= len(names):
            ax.set_xlabel("compute event (#)", fontsize=7)
    if title:
        fig.suptitle(title + ("" if budget_bytes is None else "  (dashed: budget)"), fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- series of the figure scripts

#: Names the figure scripts give to a variant or ablation of a shipped policy -> that policy.
#: A variant is drawn in its policy's colour, told apart from the policy (and from the policy's
#: other variants) by an open marker, a broken line or a hatched bar (:func:`series_style`).
POLICY_VARIANTS: dict[str, str] = {
    "sqrtn_budget": "sqrtn", "chen_greedy": "sqrtn",  # budget_sweep
    "griewank_logn": "griewank",
    "checkmate_lp": "checkmate",
    "jax_nothing_saveable": "jax_policy", "jax_dots_saveable": "jax_policy",
    "jax_dots_with_no_batch_dims_saveable": "jax_policy", "jax_everything_saveable": "jax_policy",
    "pool_only": "melon", "recompute_only": "melon",  # melon_batch ablations
    "remat_only": "poet", "paging_only": "poet",  # poet_energy ablations
    "checkpoint_first": "sage", "accumulate_first_mtp1": "sage", "dgc": "sage",  # sage_*
    "dga": "sage", "sage_ghost_bn": "sage",
    "basic": "nntrainer", "optimized_v1": "nntrainer", "optimized_v3": "nntrainer",
}

#: Aliases that *are* a shipped policy under another name (drawn exactly as the policy).
POLICY_ALIASES: dict[str, str] = {
    "accumulate_first": "sage",  # Sage's own order (the policy's default)
    "melon_pool": "melon",  # the placement the Melon policy uses
    "no_remat": "checkpoint_all",
}

#: Fixed styles of series that are not policies: memory-layout strategies (the same strategy
#: looks the same in the Melon, NNTrainer and OLLA figures) and lower bounds; ``color`` and
#: ``marker``, optionally ``hatch``, ``fill`` and ``linestyle`` (see :func:`series_style`).
SERIES_STYLES: dict[str, dict[str, str]] = {
    "first_fit": {"color": "#393b79", "marker": "o"},
    "on_demand": {"color": "#393b79", "marker": "o"},  # first fit at allocation time
    "best_fit": {"color": "#637939", "marker": "s"},
    "large_first": {"color": "#8c6d31", "marker": "^"},  # greedy by size
    "lifetime_aware": {"color": "#843c39", "marker": "v"},
    # refinements of the lifetime-aware greedy: its colour, hatched / open
    "lifetime_aware_lowest": {"color": "#843c39", "marker": "D", "hatch": "////", "fill": "none",
                              "linestyle": "--"},
    "lifetime_aware_refined": {"color": "#843c39", "marker": "X", "hatch": "xxx", "fill": "none",
                               "linestyle": ":"},
    "program_order": {"color": "#7f7f7f", "marker": "o"},
    "half_batch": {"color": "#e7ba52", "marker": "o"},  # static accumulation (SGA), no remat
    "lower_bound": {"color": "#000000", "marker": "_"},
    "max_live_bound": {"color": "#000000", "marker": "_"},
}

_VARIANT_LINES: tuple = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 3)))
_VARIANT_HATCHES = ("////", "\\\\\\\\", "xxx", "...", "+++", "ooo")
_VARIANT_MARKERS = ("o", "s", "^", "v", "D", "P", "X")


def policy_of(name: str) -> str | None:
    """The shipped policy a series name is or belongs to (``"chen_greedy" -> "sqrtn"``), else
    ``None`` (a layout strategy, a bound, a plugin policy)."""
    if name in POLICY_STYLES:
        return name
    return POLICY_ALIASES.get(name) or POLICY_VARIANTS.get(name)


def series_style(name: str) -> dict[str, Any]:
    """How a figure draws series ``name``: ``{"color", "marker", "linestyle", "fill", "hatch",
    "policy"}``.

    * a shipped policy or an alias of one: :func:`style` of it, solid line, filled marker, no
      hatch;
    * a variant (:data:`POLICY_VARIANTS`): the policy's colour; its rank ``k`` among that
      policy's variants (table order, so the same in every figure) picks a broken line, an open
      marker (the policy's own for ``k = 0``, then others) and a bar hatch;
    * a layout strategy or bound (:data:`SERIES_STYLES`): its fixed colour and marker;
    * anything else: :func:`style`'s hash fallback.
    ``fill`` is ``"full"`` or ``"none"`` (matplotlib ``fillstyle``); ``policy`` the shipped
    policy or ``None``."""
    out: dict[str, Any] = {"linestyle": "-", "fill": "full", "hatch": "", "policy": policy_of(name)}
    if name in POLICY_STYLES or name in POLICY_ALIASES:
        return {**out, **style(out["policy"])}
    if name in POLICY_VARIANTS:
        base = POLICY_VARIANTS[name]
        k = [v for v, p in POLICY_VARIANTS.items() if p == base].index(name)
        st = style(base)
        others = [m for m in _VARIANT_MARKERS if m != st["marker"]]
        marker = st["marker"] if k == 0 else others[(k - 1) % len(others)]
        return {**out, "color": st["color"], "marker": marker, "fill": "none",
                "linestyle": _VARIANT_LINES[k % len(_VARIANT_LINES)],
                "hatch": _VARIANT_HATCHES[k % len(_VARIANT_HATCHES)]}
    if name in SERIES_STYLES:
        return {**out, **SERIES_STYLES[name]}
    return {**out, **style(name)}


def line_kw(name: str, **over: Any) -> dict[str, Any]:
    """``ax.plot`` keyword arguments for series ``name`` (:func:`series_style`), a legend
    ``label`` of ``name``; ``over`` overrides any of them."""
    st = series_style(name)
    kw = {"color": st["color"], "marker": st["marker"], "linestyle": st["linestyle"],
          "fillstyle": st["fill"], "label": name}
    if st["fill"] == "none":
        kw["markerfacecolor"] = "none"
    return {**kw, **over}


def scatter_kw(name: str, **over: Any) -> dict[str, Any]:
    """``ax.scatter`` keyword arguments for series ``name``: filled markers in the series colour
    with a thin black edge; a variant's markers open (edge in the series colour)."""
    st = series_style(name)
    if st["fill"] == "none":
        kw = {"marker": st["marker"], "facecolors": "none", "edgecolors": st["color"],
              "linewidths": 1.2}
    else:
        kw = {"marker": st["marker"], "color": st["color"], "edgecolors": "k", "linewidths": 0.5}
    return {**kw, "label": name, **over}


def bar_kw(name: str, **over: Any) -> dict[str, Any]:
    """``ax.bar`` / ``ax.barh`` keyword arguments for series ``name``: the series colour with a
    black edge; a variant's bars hatched (:func:`series_style`)."""
    st = series_style(name)
    kw = {"color": st["color"], "edgecolor": "k", "linewidth": 0.4, "label": name}
    if st["hatch"]:
        kw["hatch"] = st["hatch"]
    return {**kw, **over}


def annotate_identical(ax, names: Sequence[str], xs: Sequence[float], ys: Sequence[float], *,
                       rtol: float = 1e-6, xytext: tuple[float, float] = (-6.0, -12.0),
                       **text_kw: Any) -> list[list[int]]:
    """Label each group of identical points (:func:`coincident_groups`) drawn on top of each
    other with ``"n identical: a, b, ..."`` (offset ``xytext`` points, right-aligned), so a
    reader knows a hidden series is there.  Returns the groups of more than one point."""
    same = [g for g in coincident_groups(xs, ys, rtol) if len(g) > 1]
    for grp in same:
        i0 = grp[0]
        ax.annotate(f"{len(grp)} identical: " + ", ".join(names[i] for i in grp),
                    (xs[i0], ys[i0]), xytext=xytext, textcoords="offset points",
                    **{"fontsize": 6, "ha": "right", "color": "0.3", **text_kw})
    return same


def save_figure(fig, path, *, dpi: int = 120, tight: bool = True) -> None:
    """Write ``fig`` to ``path`` (parent folders created) and close it; ``tight`` runs
    ``fig.tight_layout()`` first.  The one way every figure script and the CLI save a PNG."""
    import os

    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(os.fspath(path))), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
