"""Issue 18: what does and does not help HiGHS prove the 100-layer random-width MLPs optimal.

The instances of :mod:`experiments.milp_unseen` (seed, budget) are solved with the same
ChainDP warm start (the cheapest fitting frontier-form start that ``Checkmate`` picks) under one
change at a time, each with the same time limit:

* ``default``: :func:`solvers.checkmate.solve.solve_checkmate` with the whole memory chain
  (``lazy_memory=False``, how the policy called it before this experiment);
* ``presolve_off``, ``no_restart`` (``mip_allow_restart=False``), ``no_heuristics``
  (``mip_heuristic_effort=0``): HiGHS options;
* ``useful``: the dominance rows of :class:`~solvers.checkmate.formulation.Formulation`
  (only normalised schedules);
* ``no_memory_chain`` (a *relaxation*: the ``U``/``FREE`` chain dropped, memory only at step
  starts and while the frontier runs), ``no_memory_chain_useful`` (the same with the
  dominance rows): its bound is a valid bound of the full model; its schedule is replayed and
  ``fits`` says whether it keeps the budget;
* ``no_memory_chain_no_node_cuts``: the relaxation with HiGHS's cut separation at the root
  only (``mip_allow_cut_separation_at_nodes=False``);
* ``no_forward_recompute`` (a *restriction*: no recomputation in the steps up to the first
  backward node): its schedules are valid, its bound is *not* a bound of the full model.

Rows: seed, budget, variant, kind (exact / relaxation / restriction), wall seconds, status,
cost and bound over the no-remat cost, gap, and whether the returned schedule fits on replay.
Writes ``experiments/results/milp_variants.csv`` (finished rows are kept and skipped on a
rerun).  Commands that made it (2-core machine, nothing else running)::

    python -m experiments.milp_variants --instances 0:30% 2:50% --time-limit 60
    python -m experiments.milp_variants --variants no_memory_chain no_memory_chain_useful \\
        --instances 0:30% 1:30% 2:30% 3:30% 4:30% 0:50% 1:50% 2:50% 3:50% 4:50%

What it showed: no HiGHS option and neither the dominance rows nor forbidding forward-phase
recomputation let the full model prove seed 0 at 30 % or seed 2 at 50 % in 60 s, but the
relaxation without the memory chain proved 7 of the 10 instances (1.3-18.7 s) with schedules
that fit on replay, hence optimal for the full model too: what ``solve_checkmate``'s
``lazy_memory`` (the default) now does.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

OUT = pathlib.Path(__file__).resolve().parent / "results" / "milp_variants.csv"
FIELDS = ["seed", "budget", "variant", "kind", "time_limit_s", "wall_s", "status", "overhead",
          "lower_bound_overhead", "gap", "fits"]
VARIANTS = ("default", "presolve_off", "no_restart", "no_heuristics", "useful",
            "no_memory_chain", "no_memory_chain_useful", "no_forward_recompute",
            "no_memory_chain_no_node_cuts")


def _solve_model(problem, warm, variant: str, time_limit: float, first_backward: int):
    """``(status, R, cost, bound)`` of a hand-built model (the relaxation or the restriction)."""
    from solvers.checkmate.formulation import (
        Formulation,
        add_checkmate_core,
        checkmate_vector,
        decode_schedule,
    )
    from solvers.checkmate.problem import normalize, schedule_cost
    from solvers.milp import MilpModel

    model = MilpModel(variant)
    form = Formulation(memory_chain=not variant.startswith("no_memory_chain"),
                       useful=variant.endswith("useful"))
    options = ({"mip_allow_cut_separation_at_nodes": False}
               if variant.endswith("no_node_cuts") else {})
    v = add_checkmate_core(model, problem, budget=problem.budget, formulation=form)
    if variant == "no_forward_recompute":
        t, i = np.tril_indices(problem.n, -1)
        cols = v.R[t[t < first_backward], i[t < first_backward]]
        model.set_bounds(cols[cols >= 0], ub=0.0)
    x0 = checkmate_vector(model, v, problem, *normalize(problem, *warm))
    sol = model.solve("highs", time_limit=time_limit, mip_gap=1e-4, warm_start=x0,
                      options=options)
    R, S = decode_schedule(problem, v, sol.x)
    return sol.status, (R, S), schedule_cost(problem, R), sol.bound * v.cost_unit


def run(seed: int, budget: str, variant: str, time_limit: float) -> dict:
    """One row of the CSV (see the module docstring)."""
    import policies
    import remat
    from experiments.milp_unseen import random_width_mlp
    from solvers.checkmate import CheckmateProblem
    from solvers.checkmate.formulation import Formulation
    from solvers.checkmate.problem import schedule_memory
    from solvers.checkmate.solve import solve_checkmate

    loss, params, batch = random_width_mlp(seed, numpy_params=True)
    g = remat.extract(loss, params, batch, stages=1000)
    b = remat.core.budget.resolve_budget(budget, g)
    problem = CheckmateProblem.from_graph(g, b)
    warm, _, _ = policies.get("checkmate", budget=b)._warm_start(g, problem)
    first_backward = min(nd.index for nd in g.nodes if nd.is_backward)
    base = float(g.costs.sum())
    kind = {"no_memory_chain": "relaxation", "no_memory_chain_useful": "relaxation",
            "no_memory_chain_no_node_cuts": "relaxation",
            "no_forward_recompute": "restriction"}.get(variant, "exact")
    t0 = time.perf_counter()
    if kind == "exact":
        kw = {"presolve_off": dict(presolve=False),
              "no_restart": dict(options={"mip_allow_restart": False}),
              "no_heuristics": dict(options={"mip_heuristic_effort": 0.0}),
              "useful": dict(formulation=Formulation(useful=True))}.get(variant, {})
        sol = solve_checkmate(problem, time_limit=time_limit, warm_start=warm,
                              lazy_memory=False, **kw)
        status, sched, cost, bound = sol.status, (sol.R, sol.S), sol.objective, sol.lower_bound
    else:
        status, sched, cost, bound = _solve_model(problem, warm, variant, time_limit,
                                                  first_backward)
    wall = time.perf_counter() - t0
    peak, _ = schedule_memory(problem, *sched)
    return dict(seed=seed, budget=budget, variant=variant, kind=kind, time_limit_s=time_limit,
                wall_s=round(wall, 1), status=status, overhead=round(cost / base, 5),
                lower_bound_overhead=round(bound / base, 5),
                gap=round(max(0.0, (cost - bound) / cost), 5), fits=bool(peak <= b))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--instances", nargs="+", default=["0:30%", "2:50%"],
                    help="seed:budget pairs")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--out", type=pathlib.Path, default=OUT)
    a = ap.parse_args(argv)
    from experiments.tables import ResumableCsv

    out = ResumableCsv(a.out, FIELDS, key=lambda r: (str(r["seed"]), r["budget"], r["variant"]))
    for inst in a.instances:
        seed, budget = inst.split(":")
        for variant in a.variants:
            if (seed, budget, variant) in out:
                continue
            row = run(int(seed), budget, variant, a.time_limit)
            out.append(row)
            print(row, flush=True)

if __name__ == "__main__":
    main()
