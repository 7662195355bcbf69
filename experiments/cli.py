"""The ``remat`` command line: models, inspect, plan, compare, sweep, figures.

Examples::

    remat models
    remat inspect resnet18 --batch-size 8
    remat plan mlp --policy checkmate --budget 50%
    remat compare mlp --budget 50%
    remat sweep --models mlp vgg16 --budgets 90% 70% 50% --out results.csv
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

#: Batch sizes at which activations, not weight gradients, dominate memory (CLI default).
DEFAULT_BATCH = {"mlp": 256}


def _graph(args):
    import remat

    if args.model.endswith(".json"):
        return remat.load_graph(args.model)
    batch_size = args.batch_size or DEFAULT_BATCH.get(args.model, 8)
    loss_fn, params, batch = remat.zoo.get(args.model, batch_size=batch_size)
    stages = args.stages
    if stages not in ("auto", "module", "eqn"):
        stages = int(stages)
    return remat.extract(loss_fn, params, batch, stages=stages)


def load_plugin(spec: str) -> None:
    """Import ``spec`` (a ``.py`` file path or a dotted module name) so that the policies it
    registers with ``@policies.register`` join the registry."""
    import importlib
    import importlib.util

    from remat.errors import RematError

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
    from remat.errors import format_bytes

    return "" if n in (None, "") else format_bytes(float(n))


def cmd_models(args) -> int:
    import remat

    for name in remat.zoo.available():
        print(name)
    return 0


def cmd_inspect(args) -> int:
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


def compare(graph, budget, *, names: Sequence[str] | None = None, time_limit: float = 30.0) -> list[dict]:
    """Plan ``graph`` with every registered policy at ``budget``; one result row each."""
    import policies
    from experiments.harness import evaluate

    rows = []
    for name in names or policies.available():
        try:
            pol = _make_policy(name, time_limit)
        except Exception as exc:  # a policy that cannot be built is reported, not hidden
            rows.append({"policy": name, "status": "error", "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows.append(evaluate(graph, pol, budget, policy_name=name))
    return rows


def cmd_compare(args) -> int:
    g = _graph(args)
    print(g.summary())
    rows = compare(g, args.budget, names=args.policies, time_limit=args.time_limit)
    print(f"\nbudget {args.budget} = {_fmt_bytes(rows[0].get('budget_bytes')) if rows else ''}")
    print(f"{'policy':22} {'status':12} {'peak':>12} {'overhead':>9} {'solve_s':>8}  note")
    for r in rows:
        note = (r.get("error") or "")[:60]
        if r.get("status") == "infeasible":
            note = f"smallest feasible budget {_fmt_bytes(r.get('min_feasible_bytes'))}"
        ov = r.get("overhead")
        st = r.get("solve_time_s")
        print(
            f"{r['policy']:22} {r.get('status', ''):12} {_fmt_bytes(r.get('peak_bytes')):>12} "
            f"{(f'{ov:.3f}x' if isinstance(ov, float) else ''):>9} "
            f"{(f'{st:.2f}' if isinstance(st, float) else ''):>8}  {note}"
        )
    if args.plot:
        _plot_compare(rows, g, args.plot)
        print(f"\nplot written to {args.plot}")
    ok = [r for r in rows if r.get("status") not in ("error", "crash", "infeasible", "n/a")]
    return 0 if ok else 1


def _plot_compare(rows, graph, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if isinstance(r.get("overhead"), float)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for r in ok:
        ax.scatter(r["peak_bytes"] / 2**20, r["overhead"], label=r["policy"])
    if ok and ok[0].get("budget_bytes") is not None:
        ax.axvline(ok[0]["budget_bytes"] / 2**20, color="k", ls="--", lw=1, label="budget")
    ax.set_xlabel("simulated peak activation memory (MiB)")
    ax.set_ylabel("compute overhead vs checkpoint-all")
    ax.set_title(graph.name)
    if ok:
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cmd_sweep(args) -> int:
    import policies
    import remat
    from experiments.harness import sweep

    def loader(name):
        def build():
            if name.endswith(".json"):
                return remat.load_graph(name)
            bs = args.batch_size or DEFAULT_BATCH.get(name, 8)
            loss_fn, params, batch = remat.zoo.get(name, batch_size=bs)
            st = args.stages if args.stages in ("auto", "module", "eqn") else int(args.stages)
            return remat.extract(loss_fn, params, batch, stages=st)

        return build

    names = args.policies or policies.available()
    pols = {n: _make_policy(n, args.time_limit) for n in names}
    rows = sweep({m: loader(m) for m in args.models}, pols, args.budgets, out=args.out)
    print(f"{len(rows)} rows in {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="remat", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(sp, model=True):
        if model:
            sp.add_argument("model", help="zoo model name or a node-link JSON graph file")
        sp.add_argument("--batch-size", type=int, default=None, help="default: 256 for mlp, else 8")
        sp.add_argument("--stages", default="auto", help='"auto", "module", "eqn" or an int')
        sp.add_argument("--time-limit", type=float, default=20.0, help="per-solver seconds")
        sp.add_argument("--plugin", action="append", default=[], metavar="FILE_OR_MODULE",
                        help="import a module (a .py path or a dotted name) that registers "
                             "policies, before running; repeatable")

    sp = sub.add_parser("models", help="list zoo models")
    sp.set_defaults(fn=cmd_models)
    sp = sub.add_parser("inspect", help="show a model's training graph")
    common(sp)
    sp.set_defaults(fn=cmd_inspect)
    sp = sub.add_parser("plan", help="plan one model with one policy")
    common(sp)
    sp.add_argument("--policy", required=True)
    sp.add_argument("--budget", default=None)
    sp.set_defaults(fn=cmd_plan)
    sp = sub.add_parser("compare", help="every policy at one budget: a table and a plot")
    common(sp)
    sp.add_argument("--budget", required=True)
    sp.add_argument("--policies", nargs="*", default=None)
    sp.add_argument("--plot", default=None, help="PNG path (default compare_<model>.png)")
    sp.set_defaults(fn=cmd_compare)
    sp = sub.add_parser("sweep", help="(model x policy x budget) sweep to a resumable CSV")
    common(sp, model=False)
    sp.add_argument("--models", nargs="+", required=True)
    sp.add_argument("--policies", nargs="*", default=None)
    sp.add_argument("--budgets", nargs="+", required=True)
    sp.add_argument("--out", required=True)
    sp.set_defaults(fn=cmd_sweep)
    args = p.parse_args(argv)
    if getattr(args, "cmd", None) == "compare" and args.plot is None:
        args.plot = f"compare_{os.path.basename(args.model).split('.')[0]}.png"
    from remat.errors import RematError

    try:
        for plug in getattr(args, "plugin", ()):
            load_plugin(plug)
        return int(args.fn(args) or 0)
    except RematError as exc:
        print(f"remat: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
