"""Issue 18: the exact MILP on graphs it was not tuned on -- 100-layer random-width Flax MLPs.

Each seed draws 100 ``Dense`` widths uniformly in 16..96 (``numpy.random.default_rng(seed)``),
``tanh`` after every layer, batch 64, 32 input features, mean-squared-error loss; extracted with
one stage per ``Dense`` (``stages=1000``: 98 stages per half after the int mode's merging of
tiny trailing runs) and planned with ``Checkmate`` at 30% and 50% of the no-remat peak.  One row
per (seed, budget, warm start): wall time of ``plan()``, status, cost over the no-remat cost,
gap, proven bound, which candidate was returned, and the warm start's own cost.

    python experiments/milp_unseen.py [--seeds 0 1 2 3 4] [--time-limit 60] [--cold]
    python experiments/milp_unseen.py --solver cpsat       # OR-Tools CP-SAT back end
    python experiments/milp_unseen.py --portfolio both     # two HiGHS seeds at once vs one
    python experiments/milp_unseen.py --save-instances DIR # keep the graphs (load_instance)

Writes ``experiments/results/milp_unseen.csv`` (rows of a finished (seed, budget, warm) are kept
and skipped on a rerun).  The graphs' costs come from a per-process host calibration, so each
run has its own instances.  Commands that made the committed files (shown on
``docs/results/milp.md``):

``experiments/results/milp_unseen.csv``: HiGHS with and without path cuts on the same
instances, and CP-SAT on seed 0::

    python experiments/milp_unseen.py --path-cuts both
    python experiments/milp_unseen.py --solver cpsat --seeds 0

``experiments/results/milp_unseen_600s.csv``: how long the 30 % proofs take (made with the
whole memory chain, before the lazy chain was the default)::

    python experiments/milp_unseen.py --budgets 30% --time-limit 600 \\
        --out experiments/results/milp_unseen_600s.csv

``experiments/results/milp_unseen_portfolio.csv``: two HiGHS seeds at once against one::

    python experiments/milp_unseen.py --portfolio both \\
        --out experiments/results/milp_unseen_portfolio.csv

``experiments/results/milp_unseen_portfolio_repeats.csv``: four more calibrations at 30 % with
the defaults, runs K = 2..5, their rows concatenated with the columns ``calibration_run`` (K)
and ``stall_rounds`` (the cut loop's stall rule then: 8, and 16 from run 5)::

    python experiments/milp_unseen.py --budgets 30% --out /tmp/run_K.csv [--save-instances DIR]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import pathlib
import time

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent / "results" / "milp_unseen.csv"
FIELDS = ["seed", "budget", "warm_start", "stages", "nodes", "time_limit_s", "wall_s", "status",
          "overhead", "gap", "lower_bound_overhead", "best_of", "warm_source", "warm_overhead", "solver"]


def random_width_mlp(seed: int, layers: int = 100, batch: int = 64, features: int = 32,
                     numpy_params: bool = False):
    """``(loss, params, batch)`` of a Flax linen MLP with random widths (16..96).

    ``numpy_params``: draw the parameters with numpy in linen's layout (``Dense_i`` kernels
    scaled normal, zero biases) instead of ``Module.init``, which runs eagerly (25 s at 60
    layers on the 2-core machine); the widths are the same."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    widths = tuple(int(w) for w in np.random.default_rng(seed).integers(16, 97, size=layers))

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for w in widths:
                x = jnp.tanh(nn.Dense(w)(x))
            return x

    m = MLP()
    x = jax.random.normal(jax.random.PRNGKey(seed), (batch, features))
    y = jax.random.normal(jax.random.PRNGKey(seed + 1), (batch, widths[-1]))
    if numpy_params:
        rng, dims = np.random.default_rng(seed), (features,) + widths
        params = {"params": {f"Dense_{i}": {
            "kernel": jnp.asarray(rng.normal(size=dims[i:i + 2]) / np.sqrt(dims[i]), jnp.float32),
            "bias": jnp.zeros(dims[i + 1], jnp.float32)} for i in range(layers)}}
    else:
        params = m.init(jax.random.PRNGKey(seed), x)

    def loss(p, b):
        return jnp.mean((m.apply(p, b["x"]) - b["y"]) ** 2)

    return loss, params, {"x": x, "y": y}


def load_instance(path: str | pathlib.Path, budget: str = "30%"):
    """The :class:`~solvers.checkmate.CheckmateProblem` of a graph saved with
    ``--save-instances`` at ``budget`` (a fraction of its no-remat peak, as ``"30%"``).

    ``solvers.checkmate.solve_checkmate(load_instance(...))`` then solves the same instance
    without its extraction (the policy's ChainDP warm start needs the graph; the solver's own
    heuristics start it here)."""
    import math

    from remat.core.errors import BudgetFormatError
    from solvers.checkmate import CheckmateProblem

    try:
        frac = float(budget[:-1]) / 100.0 if budget.endswith("%") else math.nan
    except (AttributeError, ValueError):
        frac = math.nan
    if not 0.0 < frac:
        raise BudgetFormatError(f"budget must be a percentage of the no-remat peak such as "
                                f"'30%', got {budget!r}")
    z = np.load(path)
    return CheckmateProblem(len(z["costs"]), z["edges"], z["costs"], z["sizes"],
                            math.ceil(frac * int(z["no_remat_peak"])))


def main(argv=None) -> None:
    import policies
    import remat

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--budgets", nargs="+", default=["30%", "50%"])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--cold", action="store_true", help="also run with warm_start=False")
    ap.add_argument("--stages", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=100, help="Dense layers of each MLP")
    ap.add_argument("--solver", default="highs", choices=["highs", "cpsat"])
    ap.add_argument("--path-cuts", choices=["on", "off", "both"], default="on",
                    help="Checkmate(path_cuts=...); 'off' rows say solver "
                         "'<solver>-no-path-cuts'; 'both' solves each graph both ways (one "
                         "extraction, so one host calibration: the same instance)")
    ap.add_argument("--portfolio", choices=["auto", "1", "both"], default="auto",
                    help="Checkmate(portfolio=...): 'auto' is the default (two HiGHS seeds at "
                         "once on two or more cores); '1' rows say solver '<solver>-1-search'; "
                         "'both' solves each graph both ways (the same instance)")
    ap.add_argument("--save-instances", type=pathlib.Path, default=None, metavar="DIR",
                    help="write each graph's arrays (edges, costs, sizes, no-remat peak) to "
                         "DIR/seed<k>.npz: the costs come from this process's host "
                         "calibration, so a rerun of the script makes other instances; these "
                         "files replay one exactly (see load_instance)")
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    a = ap.parse_args(argv)
    from experiments.tables import ResumableCsv, write_rows

    if a.out.exists():  # older files had no solver column: add it (rows of HiGHS)
        with a.out.open() as f:
            old = list(csv.DictReader(f))
        if old and "solver" not in old[0]:
            write_rows(a.out, [{**r, "solver": "highs"} for r in old], fields=FIELDS)
    out = ResumableCsv(a.out, FIELDS, key=lambda r: (str(r["seed"]), r["budget"],
                                                     str(r["warm_start"]), r["solver"]))
    cut_modes = {"on": [True], "off": [False], "both": [False, True]}[a.path_cuts]
    searches = {"auto": [None], "1": [1], "both": [1, None]}[a.portfolio]
    for seed in a.seeds:
        loss, params, batch = random_width_mlp(seed, layers=a.layers)
        g = remat.extract(loss, params, batch, stages=a.stages)
        base = float(g.costs.sum())
        if a.save_instances is not None:
            a.save_instances.mkdir(parents=True, exist_ok=True)
            np.savez(a.save_instances / f"seed{seed}.npz", edges=g.edge_array, costs=g.costs,
                     sizes=g.sizes, no_remat_peak=g.no_remat_peak(), seed=seed)
        for budget in a.budgets:
            for warm, cuts, members in itertools.product([True, False] if a.cold else [True],
                                                         cut_modes, searches):
                label = (a.solver + ("" if cuts else "-no-path-cuts")
                         + ("-1-search" if members == 1 else ""))
                if (str(seed), budget, str(warm), label) in out:
                    continue
                t = time.perf_counter()
                plan = policies.get("checkmate", budget=budget, time_limit=a.time_limit,
                                    warm_start=warm, solver=a.solver,
                                    path_cuts=cuts, portfolio=members).plan(g)
                m = plan.meta
                tried = m.get("tried", {})
                src = m.get("warm_start")
                row = dict(seed=seed, budget=budget, warm_start=warm, stages=a.stages,
                           nodes=g.n, time_limit_s=a.time_limit,
                           wall_s=round(time.perf_counter() - t, 2), status=m["status"],
                           overhead=round(m["objective"] / base, 5),
                           gap=round(float(m["gap"]), 5),
                           lower_bound_overhead=round(float(m["lower_bound"]) / base, 5),
                           best_of=m.get("best_of"), warm_source=src,
                           warm_overhead=(round(tried[src] / base, 5)
                                          if tried.get(src) is not None else ""),
                           solver=label)
                out.append(row)
                print(row, flush=True)

if __name__ == "__main__":
    main()
