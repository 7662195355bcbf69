"""The ``remat`` command line: models, inspect, plan, compare, sweep, figures.

Examples::

    remat models
    remat inspect resnet18 --batch-size 8
    remat inspect mlp --timeline mlp_timeline.png --budget 90%
    remat plan mlp --policy checkmate --budget 50%
    remat compare mlp --budget 50% --timeline
    remat sweep --models mlp vgg16 --budgets 90% 70% 50% --out results.csv
    remat sweep --models mlp --budgets 90% 50% --devices pixel-4 --backend ray --out r.parquet
    remat figures --quick --only melon_pool sage_passes
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from experiments import cli_args
from experiments.cli_args import STAGES

#: Batch sizes at which activations, not weight gradients, dominate memory (CLI default).
DEFAULT_BATCH = {"mlp": 256}

def _graph(args):
    import remat

    if args.model.endswith(".json"):
        return remat.load_graph(args.model)
    batch_size = args.batch_size or DEFAULT_BATCH.get(args.model, 8)
    loss_fn, params, batch = remat.zoo.get(args.model, batch_size=batch_size)
    return remat.extract(loss_fn, params, batch, stages=args.stages)


def load_plugin(spec: str) -> None:
    """Import ``spec`` (a ``.py`` file path or a dotted module name) so that the policies it
    registers with ``@policies.register`` join the registry."""
    import importlib
    import importlib.util

    from remat.core.errors import RematError

    if spec.endswith(".py"):
        name = "remat_plugin_" + os.path.splitext(os.path.basename(spec))[0]
        if not os.path.exists(spec):
            raise RematError(f"no plugin file {spec!r}")
        loader = importlib.util.spec_from_file_location(name, spec)
        mod = importlib.util.module_from_spec(loader)
        sys.modules[name] = mod
        loader.loader.exec_module(mod)
    else:
        try:
            importlib.import_module(spec)
        except ModuleNotFoundError as exc:
            raise RematError(f"no plugin module {spec!r} ({exc})") from None


def _make_policy(name: str, time_limit: float):
    import policies

    takes_limit = "time_limit" in policies.option_names(name)
    return policies.get(name, **({"time_limit": time_limit} if takes_limit else {}))


def _fmt_bytes(n) -> str:
    from remat.core.errors import format_bytes

    return "" if n in (None, "") else format_bytes(float(n))


def cmd_models(args) -> int:
    import remat

    for name in remat.zoo.available():
        print(name)
    return 0


#: Policies ``remat inspect --timeline`` draws when ``--policies`` is not given: the no-remat
#: baseline, the classic heuristic and the (fast, exact on chains) dynamic programme.
INSPECT_TIMELINE_POLICIES = ("checkpoint_all", "sqrtn", "chain_dp")


def cmd_inspect(args) -> int:
    """Print the graph node by node; with ``--timeline PATH`` also plan it with each of
    ``--policies`` at ``--budget``, simulate (:func:`remat.simulate`) and draw the per-policy
    live-activation timelines side by side (:func:`_plot_timelines`, as ``compare --timeline``)."""
    names = None
    if args.timeline:
        names = [n.strip() for n in (args.policies or ",".join(INSPECT_TIMELINE_POLICIES)).split(",")
                 if n.strip()]
    t0 = time.perf_counter()
    g = _graph(args)
    print(g.summary())
    print(f"(extracted in {time.perf_counter() - t0:.2f} s)")
    print(f"{'#':>4} {'node':40} {'fwd/bwd':7} {'GFLOP':>9} {'out':>12} {'time_s':>10}")
    for v in g.nodes:
        print(
            f"{v.index:>4} {v.name[:40]:40} {'bwd' if v.is_backward else 'fwd':7} "
            f"{v.flops / 1e9:9.3f} {_fmt_bytes(v.out_bytes):>12} {v.time_s:10.2e}"
        )
    if not names:
        return 0
    reports: dict = {}
    rows = compare(g, args.budget, names=names, time_limit=args.time_limit,
                   device=_compare_device(args, g), reports=reports)
    print(f"\ntimelines at budget {args.budget or 'each policy default'}:")
    for r in rows:
        rep = reports.get(r["policy"])
        if rep is not None:
            print(f"  {r['policy']:16} peak {_fmt_bytes(rep.peak_bytes):>12}  "
                  f"overhead {rep.overhead:.3f}x")
        else:
            why = (f"smallest feasible budget {_fmt_bytes(r.get('min_feasible_bytes'))}"
                   if r.get("status") == "infeasible" else (r.get("error") or "")[:70])
            print(f"  {r['policy']:16} no timeline ({r.get('status', '')}: {why})")
    if not reports:
        from remat.core.errors import RematError

        raise RematError(f"no policy of {', '.join(names)} made a plan at budget {args.budget}")
    _plot_timelines(reports, rows, g, args.timeline)
    print(f"timelines written to {args.timeline}")
    return 0


def cmd_plan(args) -> int:
    import remat

    g = _graph(args)
    pol = _make_policy(args.policy, args.time_limit)
    plan = pol.plan(g, budget=args.budget)
    rep = remat.simulate(g, plan)
    print(g.summary())
    print(plan.summary(g))
    print(
        f"peak {_fmt_bytes(rep.peak_bytes)} (no-remat {_fmt_bytes(g.no_remat_peak())}), "
        f"overhead {rep.overhead:.3f}x, solve {plan.meta.get('solve_time_s', 0):.2f} s"
    )
    return 0


# ``remat compare`` plans Checkmate with HiGHS and OR-Tools CP-SAT racing (first proof wins,
# solvers/milp/backends/race.py) up to this many nodes when the ``cpsat`` extra is installed: neither
# solver proves every zoo model at the CLI's 20 s (experiments/results/cpsat_benchmark.csv)
CPSAT_MAX_NODES = 100
# MILP policies in ``remat compare`` stop within this relative gap of their proven bound (the
# table prints each gap; ``--mip-gap 1e-4`` for the solvers' own default)
COMPARE_MIP_GAP = 0.01
# ``remat compare``'s per-solver time limit (seconds): at 20 s POET stopped at ``time_limit`` on
# ResNet-50 (gap 1.05 %) and SqueezeNet (4.2 %) at 50 %, which it closes in 6-21 s when not cut off
# (experiments/results/compare_zoo_50.txt); models whose MILPs end sooner take no longer
COMPARE_TIME_LIMIT = 60.0


def _make_policy_for(name: str, time_limit: float, device=None, *, graph=None,
                     mip_gap: float | None = None):
    """``_make_policy`` plus ``device=`` for the policies that take one (POET, Sage, NNTrainer),
    so their plans are costed on the device the comparison simulates; ``mip_gap`` for those
    that take one; Checkmate's HiGHS/CP-SAT race up to :data:`CPSAT_MAX_NODES` nodes."""
    import policies
    from solvers.milp.backends import cpsat

    opts = policies.option_names(name)
    kw: dict = {"time_limit": time_limit} if "time_limit" in opts else {}
    if device is not None and "device" in opts:
        kw["device"] = device
    if mip_gap is not None and "mip_gap" in opts:
        kw["mip_gap"] = float(mip_gap)
    if (name == "checkmate" and graph is not None and graph.n <= CPSAT_MAX_NODES
            and "solver" in opts and cpsat.available()):
        kw["solver"] = "race"
    return policies.get(name, **kw)


class _Recorder:
    """Forwards ``plan`` to a policy and keeps the plan it returned."""

    def __init__(self, policy):
        self.policy = policy
        self.name = getattr(policy, "name", type(policy).__name__)
        self.last_plan = None

    def plan(self, graph, budget=None):
        self.last_plan = self.policy.plan(graph, budget=budget)
        return self.last_plan


def compare(graph, budget, *, names: Sequence[str] | None = None, time_limit: float = 30.0,
            device=None, reports: dict | None = None,
            mip_gap: float | None = COMPARE_MIP_GAP) -> list[dict]:
    """Plan ``graph`` with every registered policy at ``budget``; one result row each.

    Args:
      graph: the training graph.
      budget: bytes or a string (``"50%"``, ``"512MiB"``).
      names: policies to run (default: ``policies.available()``).
      time_limit: per-solver wall-clock seconds.
      device: a :mod:`remat.devices` profile (or name) for modelled time/energy and paging
        costs, also given to policies that take a ``device``; ``None``: the graph's own costs and
        paging in bytes only.
      reports: when a dict, filled with ``policy name -> remat.Report`` of each plan made.
      mip_gap: relative gap at which MILP policies stop (``None``: each policy's default).

    Returns:
      ``experiments.harness.evaluate`` rows plus ``paging_time_s``, ``paging_energy_j`` (J) and
      ``bytes_paged`` for each plan made.
    """
    import policies
    import remat
    from experiments.harness import evaluate

    rows = []
    for name in names or policies.available():
        try:
            pol = _Recorder(_make_policy_for(name, time_limit, device, graph=graph,
                                             mip_gap=mip_gap))
        except Exception as exc:  # a policy that cannot be built is reported, not hidden
            rows.append({"policy": name, "status": "error", "error": f"{type(exc).__name__}: {exc}"})
            continue
        row = evaluate(graph, pol, budget, device=device, policy_name=name)
        if pol.last_plan is not None and isinstance(row.get("overhead"), float):
            rep = remat.simulate(graph, pol.last_plan, device=device)
            row.update(paging_time_s=rep.paging_time_s, paging_energy_j=rep.paging_energy_j,
                       bytes_paged=rep.bytes_paged)
            if reports is not None:
                reports[name] = rep
        rows.append(row)
    return rows


def _compare_device(args, graph):
    """The device a comparison models: ``--device``, else the profile the graph was extracted
    with (so compute costs are the graph's own and paging gets a price), else ``None``."""
    name = getattr(args, "device", None) or graph.meta.get("device")
    if not name:
        return None
    import remat

    try:
        return remat.devices.get(name)
    except remat.errors.RematError:
        if getattr(args, "device", None):
            raise
        return None  # a graph made with an unnamed profile: use its own costs


def cmd_compare(args) -> int:
    g = _graph(args)
    print(g.summary())
    device = _compare_device(args, g)
    reports: dict = {}
    rows = compare(g, args.budget, names=args.policies, time_limit=args.time_limit,
                   device=device, reports=reports, mip_gap=args.mip_gap)
    unit = "s" if device is not None else g.meta.get("cost_unit", "s")
    dev = f", costs modelled on {device.name}" if device is not None else ""
    print(f"\nbudget {args.budget} = {_fmt_bytes(rows[0].get('budget_bytes')) if rows else ''}{dev}")
    print(f"{'policy':22} {'status':12} {'gap':>6} {'peak':>12} {'overhead':>9} "
          f"{'time_' + unit:>10} {'energy_J':>10} {'paged':>11} {'solve_s':>8}  note")
    for r in rows:
        note = (r.get("error") or "")[:60]
        if r.get("status") == "infeasible":
            note = f"smallest feasible budget {_fmt_bytes(r.get('min_feasible_bytes'))}"
        ov = r.get("overhead")
        st = r.get("solve_time_s")
        t = r.get("compute_time_s")
        if isinstance(t, float):
            t += r.get("paging_time_s", 0.0)
        e = r.get("energy_j")
        paged = r.get("bytes_paged")
        gap = r.get("gap")
        gap = f"{gap:.2%}" if isinstance(gap, float) and gap > 0 else ""
        print(
            f"{r['policy']:22} {r.get('status', ''):12} {gap:>6} "
            f"{_fmt_bytes(r.get('peak_bytes')):>12} "
            f"{(f'{ov:.3f}x' if isinstance(ov, float) else ''):>9} "
            f"{(f'{t:.3g}' if isinstance(t, float) else ''):>10} "
            f"{(f'{e:.3g}' if isinstance(e, float) and device is not None else ''):>10} "
            f"{(_fmt_bytes(paged) if paged else ''):>11} "
            f"{(f'{st:.2f}' if isinstance(st, float) else ''):>8}  {note}"
        )
    if args.plot:
        _plot_compare(rows, g, args.plot, unit=unit, device=device)
        print(f"\nplot written to {args.plot}")
        if args.timeline:
            tl = timeline_path(args.plot)
            _plot_timelines(reports, rows, g, tl)
            print(f"timelines written to {tl}")
    ok = [r for r in rows if r.get("status") not in ("error", "crash", "infeasible", "n/a")]
    return 0 if ok else 1


def timeline_path(plot_path: str) -> str:
    """Where ``remat compare --timeline`` writes the timelines: ``<plot>_timeline.png``."""
    root, ext = os.path.splitext(plot_path)
    return f"{root}_timeline{ext or '.png'}"


def _plot_compare(rows, graph, path, *, unit: str = "s", device=None) -> None:
    """Left: simulated peak (MiB) against overhead (x), one style per policy, coincident plans
    stacked apart; middle/right: modelled time and energy, compute solid and paging hatched."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from experiments import plotstyle as ps

    ok = [r for r in rows if isinstance(r.get("overhead"), float)]
    show_energy = device is not None and any(r.get("energy_j") for r in ok)
    ncols = 3 if show_energy else 2
    fig, axes = plt.subplots(1, ncols, figsize=(4.6 * ncols, 0.5 + max(3.6, 0.28 * len(ok))),
                             gridspec_kw={"width_ratios": [1.4] + [1] * (ncols - 1)})
    budget = ok[0].get("budget_bytes") if ok else None
    ps.memory_vs_overhead(axes[0], [r["policy"] for r in ok], [r["peak_bytes"] for r in ok],
                          [r["overhead"] for r in ok],
                          budget_bytes=None if budget in (None, "") else float(budget),
                          title=f"{graph.name}: memory vs recompute",
                          paged_bytes=[r.get("bytes_paged", 0) or 0 for r in ok])
    names = [r["policy"] for r in ok]
    paged = [r.get("bytes_paged", 0) or 0 for r in ok]
    ptime = [r.get("paging_time_s", 0.0) or 0.0 for r in ok]
    ps.cost_bars(axes[1], names, [r["compute_time_s"] for r in ok], ptime, unit=unit,
                 what="modelled step time", paged_bytes=paged)
    dev = f" on {device.name}" if device is not None else ""
    axes[1].set_title(f"time{dev}", fontsize=9)
    if show_energy:
        pe = [r.get("paging_energy_j", 0.0) or 0.0 for r in ok]
        ps.cost_bars(axes[2], names, [r["energy_j"] - p for r, p in zip(ok, pe)], pe, unit="J",
                     what="modelled step energy", paged_bytes=paged)
        axes[2].set_title(f"energy{dev}", fontsize=9)
    ps.save_figure(fig, path)


def _plot_timelines(reports, rows, graph, path) -> None:
    import matplotlib

    matplotlib.use("Agg")

    from experiments import plotstyle as ps

    budget = next((r.get("budget_bytes") for r in rows if r.get("budget_bytes") not in (None, "")), None)
    fig = ps.plot_timelines(reports, budget_bytes=None if budget is None else float(budget),
                            title=f"{graph.name}: live activation memory per plan")
    ps.save_figure(fig, path, tight=False)


def cmd_sweep(args) -> int:
    """``experiments.harness.sweep`` over zoo names / JSON graphs and registry policies; a
    model without ``--batch-sizes`` runs at its CLI default batch (``DEFAULT_BATCH``, else 8)."""
    import policies
    from experiments.harness import sweep

    names = args.policies or policies.available()
    st = args.stages
    if args.batch_sizes or args.batch_size:
        groups = {tuple(args.batch_sizes or [args.batch_size]): list(args.models)}
    else:
        groups = {}
        for m in args.models:
            bs = None if m.endswith(".json") else DEFAULT_BATCH.get(m, 8)
            groups.setdefault((bs,), []).append(m)
    rows: list = []
    for batch_sizes, models in groups.items():
        rows = sweep({m: m for m in models}, names, args.budgets, out=args.out,
                     batch_sizes=list(batch_sizes), devices=args.devices or [None],
                     backend=args.backend, address=args.address, num_cpus=args.num_cpus,
                     threads=args.threads, time_limit=args.time_limit,
                     residuals=not args.no_residuals, stages=st, quick=args.quick,
                     execute=args.execute,
                     formats=args.format)
    print(f"{len(rows)} rows in {args.out}")
    return 0


def cmd_figures(args) -> int:
    from experiments.figures_index import run_figures, select

    select(args.only)  # an unknown name fails before anything runs
    results = run_figures(args.only, out=args.out, quick=args.quick)
    return 0 if all(r.status == "ok" for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = cli_args.Parser(prog="remat", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, model=True):
        if model:
            sp.add_argument("model", help="zoo model name or a node-link JSON graph file")
        sp.add_argument("--batch-size", type=cli_args.positive_int, default=None, help="default: 256 for mlp, else 8")
        sp.add_argument("--stages", type=cli_args.stages, default="auto",
                        help=f"{', '.join(STAGES)} or an int")
        sp.add_argument("--time-limit", type=cli_args.positive_float, default=20.0, help="per-solver seconds")
        sp.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="import a module (a .py path or a dotted name) that registers "
                             "policies, before running; repeatable")

    sp = sub.add_parser("models", help="list zoo models")
    sp.set_defaults(fn=cmd_models)
    sp = sub.add_parser("inspect", help="show a model's training graph (and memory timelines)")
    common(sp)
    sp.add_argument("--timeline", default=None, metavar="PNG",
                    help="also plan with --policies, simulate and draw each plan's live "
                         "activation memory (MiB) per compute event to this PNG")
    sp.add_argument("--policies", default=None, metavar="A,B,C",
                    help="comma-separated policies for --timeline (default: "
                         + ",".join(INSPECT_TIMELINE_POLICIES) + ")")
    sp.add_argument("--budget", type=cli_args.budget, default=None,
                    help='budget for --timeline ("50%%", "512MiB", bytes; default: each '
                         "policy's own)")
    sp.set_defaults(fn=cmd_inspect)
    sp = sub.add_parser("plan", help="plan one model with one policy")
    common(sp)
    sp.add_argument("--policy", required=True)
    sp.add_argument("--budget", type=cli_args.budget, default=None)
    sp.set_defaults(fn=cmd_plan)
    sp = sub.add_parser("compare", help="every policy at one budget: a table and a plot")
    common(sp)
    sp.add_argument("--budget", type=cli_args.budget, required=True)
    sp.add_argument("--policies", nargs="*", default=None)
    sp.add_argument("--plot", default=None, help="PNG path (default compare_<model>.png)")
    sp.add_argument("--device", default=None,
                    help="device profile for modelled time, energy and paging costs (default: "
                         "the one the graph was extracted with)")
    sp.add_argument("--timeline", action="store_true",
                    help="also draw each plan's memory timeline to <plot>_timeline.png")
    sp.add_argument("--mip-gap", type=cli_args.nonnegative_float, default=COMPARE_MIP_GAP,
                    help="MILP policies stop within this relative gap of their proven bound "
                         f"(default {COMPARE_MIP_GAP:g}; the table prints each gap)")
    sp.set_defaults(fn=cmd_compare, time_limit=COMPARE_TIME_LIMIT)  # per-solver s
    sp = sub.add_parser("sweep", help="(model x policy x budget) sweep to a resumable CSV")
    common(sp, model=False)
    sp.add_argument("--models", nargs="+", required=True)
    sp.add_argument("--policies", nargs="*", default=None)
    sp.add_argument("--budgets", nargs="+", type=cli_args.budget, required=True)
    sp.add_argument("--out", required=True, help="CSV store (*.csv) or *.parquet")
    sp.add_argument("--batch-sizes", nargs="+", type=cli_args.positive_int, default=None)
    sp.add_argument("--devices", nargs="+", default=None, help="device profiles (remat.devices)")
    sp.add_argument("--backend", choices=["local", "ray"], default="local")
    sp.add_argument("--address", default=None, help="Ray cluster address (default: start one)")
    sp.add_argument("--num-cpus", type=cli_args.positive_int, default=None, help="CPUs of a started Ray cluster")
    sp.add_argument("--threads", type=cli_args.positive_int, default=None, help="solver threads per row")
    sp.add_argument("--quick", action="store_true",
                    help="5 s solver limit, first batch and device, at most 3 budgets")
    sp.add_argument("--format", nargs="+", choices=["csv", "parquet"], default=None)
    sp.add_argument("--execute", action="store_true",
                    help="also run each plan with remat.execute (models with a function): "
                         "executor_peak_bytes (measured activation bytes) and "
                         "executor_grad_max_rel_err vs jax.value_and_grad")
    sp.add_argument("--no-residuals", action="store_true",
                    help="skip measuring realised residual bytes (jax.checkpoint)")
    sp.set_defaults(fn=cmd_sweep)
    sp = sub.add_parser("figures", help="run every figure script; PNGs, CSVs and index.md")
    sp.add_argument("--quick", action="store_true", help="each script's quick sizes")
    sp.add_argument("--only", nargs="+", default=None, metavar="NAME",
                    help="only these figures (see experiments/figures_index.py)")
    sp.add_argument("--out", default="figures", help="output folder (default figures/)")
    sp.set_defaults(fn=cmd_figures)
    args = p.parse_args(argv)
    if getattr(args, "cmd", None) == "compare" and args.plot is None:
        args.plot = f"compare_{os.path.basename(args.model).split('.')[0]}.png"
    from remat.core.errors import RematError

    try:
        for plug in getattr(args, "plugin", ()):
            load_plugin(plug)
        if args.cmd != "figures":
            cli_args.validate(args)
        return int(args.fn(args) or 0)
    except RematError as exc:
        print(f"remat: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
