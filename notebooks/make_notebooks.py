"""Write the tutorial notebooks ``notebooks/0*_*.ipynb`` (stored without outputs).

The notebooks are generated so that their code is reviewed as Python and they stay in step with
the API; edit the cells here, then regenerate::

    /work/venv/bin/python notebooks/make_notebooks.py

``tests/test_notebooks.py`` executes every notebook at the small sizes below and checks the
marker line each one prints last (``MARKERS`` there), so the asserts inside a notebook are tests.
Each notebook ends with one line ``<name>: OK ...``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

SETUP = """\
import matplotlib.pyplot as plt
import numpy as np
import jax
import policies
import remat
from remat.core.errors import InfeasibleBudgetError, NotApplicableError
from experiments import plotstyle  # one colour and marker per policy in every figure
MIB = 2**20
"""


def md(text: str):
    return new_markdown_cell(textwrap.dedent(text).strip())


def code(*parts: str):
    return new_code_cell("\n".join(textwrap.dedent(t).strip() for t in parts))


# --------------------------------------------------------------------------------------------
POLICY_TOUR = [
    md("""
    # 01 · Policy tour

    Extract the training graph of a small zoo model, plan it with **every registered policy**
    (`policies.available()`) at one activation-memory budget, and compare what each plan costs:
    simulated peak memory, compute overhead over checkpoint-all, and the memory timeline.

    * A policy that does not apply to this graph raises `NotApplicableError` (shown as *n/a*).
    * A budget below what a policy can reach raises `InfeasibleBudgetError`, which carries the
      smallest budget it could meet (`min_feasible_bytes`).
    """),
    code(SETUP),
    code("""
    loss_fn, params, batch = remat.zoo.get('mlp', batch_size=32, depth=10, width=128)
    graph = remat.extract(loss_fn, params, batch, stages='module')
    BUDGET = '70%'  # of the checkpoint-all (no-remat) peak
    budget_bytes = remat.resolve_budget(BUDGET, graph)
    print(graph.summary())
    print(f'budget {BUDGET} = {budget_bytes / MIB:.3f} MiB of activations')
    """),
    md("## Every policy at one budget"),
    code("""
    rows, plans, reports = [], {}, {}
    for name in policies.available():
        opts = {'time_limit': 5.0} if 'time_limit' in policies.option_names(name) else {}
        try:
            plan = policies.get(name, **opts).plan(graph, budget=BUDGET)
        except NotApplicableError as e:
            rows.append((name, 'n/a', None, None, str(e)[:48]))
            continue
        except InfeasibleBudgetError as e:
            # an infeasibility claim must be about a budget below the stated minimum
            assert e.min_feasible_bytes > budget_bytes, (name, e.min_feasible_bytes)
            rows.append((name, 'infeasible', None, None,
                         f'needs >= {e.min_feasible_bytes / MIB:.3f} MiB'))
            continue
        rep = remat.simulate(graph, plan)  # replays the plan's events: an independent check
        assert rep.peak_bytes <= budget_bytes, (name, rep.peak_bytes, budget_bytes)
        plans[name], reports[name] = plan, rep
        rows.append((name, plan.meta['status'], rep.peak_bytes, rep.overhead, ''))

    print(f"{'policy':15} {'status':11} {'peak MiB':>9} {'overhead':>9}  note")
    for name, status, peak, ov, note in rows:
        peak_s = f'{peak / MIB:9.3f}' if peak is not None else ' ' * 9
        ov_s = f'{ov:8.3f}x' if ov is not None else ' ' * 9
        print(f'{name:15} {status:11} {peak_s} {ov_s}  {note}')
    assert len(rows) == len(policies.available()) and len(reports) >= 6
    """),
    md("""
    ## Memory timelines side by side

    Live activation bytes after each compute event of each plan (`remat.simulate(...).timeline`);
    the dashed line is the budget.
    """),
    code("""
    fig = plotstyle.plot_timelines(reports, budget_bytes=budget_bytes,
                                   title=f'{graph.name} at {BUDGET}')
    for rep in reports.values():
        assert rep.timeline['live_bytes'].max() == rep.peak_bytes
    """),
    md("""
    ## Memory against recompute

    Plans whose markers would hide each other are stacked apart vertically, each at its exact
    memory and tied to its true position (black dot) by a leader line.
    """),
    code("""
    fig, ax = plt.subplots(figsize=(6, 4))
    names = list(reports)
    plotstyle.memory_vs_overhead(ax, names, [reports[n].peak_bytes for n in names],
                                 [reports[n].overhead for n in names], budget_bytes=budget_bytes,
                                 title=f'{graph.name} at {BUDGET}')
    fig.tight_layout()
    """),
    md("""
    ## The executor agrees

    `remat.execute` runs a plan op by op and measures live bytes as it goes: its peak is the
    simulated one, and its gradients are JAX's.
    """),
    code("""
    name = 'checkmate' if 'checkmate' in plans else next(iter(plans))
    value, grads, stats = remat.execute(graph, plans[name], params, batch)
    ref_value, ref_grads = jax.value_and_grad(loss_fn)(params, batch)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    assert stats.peak_bytes == reports[name].peak_bytes
    print(f'{name}: measured peak {stats.peak_bytes} B = simulated {reports[name].peak_bytes} B')
    print(f'policy tour: OK, {len(reports)} plans fit, {len(rows) - len(reports)} without a plan')
    """),
]

# --------------------------------------------------------------------------------------------
BUDGET_SWEEP = [
    md("""
    # 02 · Budget sweep: overhead and energy against memory

    How much compute and energy does each policy pay as the activation budget shrinks? Costs
    are modelled on a device profile from `remat.devices` (here a Raspberry-Pi-class
    Cortex-A72, POET's chipset constants): per-node time and energy from FLOPs and bytes, and
    per-transfer paging time and energy for plans that page (POET).
    """),
    code(SETUP),
    code("""
    dev = remat.devices.get('cortex-a72')
    print(dev.summary())
    loss_fn, params, batch = remat.zoo.get('mlp', batch_size=32, depth=10, width=128)
    graph = remat.extract(loss_fn, params, batch, stages='module', device=dev)
    print(graph.summary())
    """),
    code("""
    FRACTIONS = [1.0, 0.85, 0.75, 0.7, 0.65]
    POLICIES = {
        'checkmate': policies.get('checkmate', time_limit=10.0),
        'chain_dp': policies.get('chain_dp'),
        'sqrtn': policies.get('sqrtn'),
        'poet': policies.get('poet', device=dev, time_limit=10.0),
    }
    peak0 = graph.no_remat_peak()
    res = {name: {} for name in POLICIES}
    for frac in FRACTIONS:
        budget = int(frac * peak0)
        for name, pol in POLICIES.items():
            try:
                plan = pol.plan(graph, budget=budget)
            except InfeasibleBudgetError as e:
                assert e.min_feasible_bytes > budget
                continue
            rep = remat.simulate(graph, plan, device=dev)
            assert rep.peak_bytes <= budget, (name, frac, rep.peak_bytes, budget)
            res[name][frac] = dict(overhead=rep.overhead, energy_j=rep.energy_j,
                                   paging_j=rep.paging_energy_j, status=plan.meta['status'])
    for name, r in res.items():
        print(name, {f: f"{v['overhead']:.3f}x {v['energy_j'] * 1e3:.2f} mJ {v['status']}"
                     for f, v in r.items()})
    """),
    md("""
    ## What the sweep must show

    * Checkmate solved to optimality recomputes no more than any other policy at the same
      budget, and its overhead does not grow as the budget grows.
    * POET minimises energy with remat *and* paging: where both are optimal it spends no more
      energy than Checkmate's plan.
    """),
    code("""
    cm = {f: v for f, v in res['checkmate'].items() if v['status'] == 'optimal'}
    for frac, v in cm.items():
        for other in ('chain_dp', 'sqrtn'):
            if frac in res[other]:
                assert v['overhead'] <= res[other][frac]['overhead'] * (1 + 1e-6), (frac, other)
        p = res['poet'].get(frac)
        if p is not None and p['status'] == 'optimal':
            assert p['energy_j'] <= v['energy_j'] * (1 + 1e-4), (frac, p, v)
    fr = sorted(cm)
    assert all(cm[a]['overhead'] >= cm[b]['overhead'] - 1e-9 for a, b in zip(fr, fr[1:]))
    assert len(cm) >= 3
    """),
    code("""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for k, (name, r) in enumerate(res.items()):
        # equal curves (Checkmate and ChainDP here) stay visible: earlier ones drawn bigger
        st = dict(marker=plotstyle.style(name)['marker'], color=plotstyle.style(name)['color'],
                  ms=10 - 2 * k, lw=3 - 0.6 * k, label=name)
        fr = sorted(r)
        x = [100 * f for f in fr]
        ax1.plot(x, [r[f]['overhead'] for f in fr], **st)
        ax2.plot(x, [r[f]['energy_j'] * 1e3 for f in fr], **st)
        if any(r[f]['paging_j'] for f in fr):
            ax2.plot(x, [r[f]['paging_j'] * 1e3 for f in fr], ls=':', color=st['color'],
                     label=f'{name}: paging part')
    ax1.set_xlabel('activation budget (% of checkpoint-all peak)')
    ax1.set_ylabel('compute overhead vs checkpoint-all (x)')
    ax2.set_xlabel('activation budget (% of checkpoint-all peak)')
    ax2.set_ylabel(f'modelled energy per step on {dev.name} (mJ)')
    ax1.invert_xaxis(); ax2.invert_xaxis()
    ax1.legend(fontsize=7); ax2.legend(fontsize=7)
    fig.tight_layout()
    print(f"budget sweep: OK, {sum(len(r) for r in res.values())} plans fit their budgets")
    """),
]

# --------------------------------------------------------------------------------------------
DROPIN = [
    md("""
    # 03 · Drop-in training with `remat.value_and_grad`

    `remat.value_and_grad(loss, policy)` is a drop-in for `jax.value_and_grad`: it extracts the
    training graph, plans it with `policy`, applies the plan with `jax.checkpoint` and returns a
    jit-able function with the same outputs. Below, one optax loop runs twice, with the plain
    gradient and with a planned one; the losses must agree.
    """),
    code(SETUP, """
    import flax.linen as nn
    import jax.numpy as jnp
    import optax
    """),
    code("""
    class MLP(nn.Module):
        width: int = 128
        depth: int = 12

        @nn.compact
        def __call__(self, x):
            for _ in range(self.depth):
                x = nn.tanh(nn.Dense(self.width)(x))
            return nn.Dense(10)(x)

    model = MLP()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 32)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, 64))
    params = model.init(jax.random.PRNGKey(0), x)

    def loss(params, x, y):
        logits = model.apply(params, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    """),
    md("""
    The planned gradient is JAX's gradient: same value, same gradients (float32, rtol 1e-5).
    """),
    code("""
    policy = policies.get('chain_dp', budget='60%')
    vg = remat.value_and_grad(loss, policy)
    plain_step, planned_step = jax.jit(jax.value_and_grad(loss)), jax.jit(vg)
    (value, grads), (ref_value, ref_grads) = planned_step(params, x, y), plain_step(params, x, y)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    """),
    md("## The same optax loop with either gradient"),
    code("""
    def train(value_and_grad_fn, params, steps=5, lr=1e-3):
        opt = optax.adam(lr)
        state = opt.init(params)
        losses = []
        for _ in range(steps):
            value, grads = value_and_grad_fn(params, x, y)
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            losses.append(float(value))
        return params, losses

    p_plain, plain = train(plain_step, params)
    p_remat, planned = train(planned_step, params)
    print('plain  ', np.round(plain, 6))
    print('planned', np.round(planned, 6))
    np.testing.assert_allclose(planned, plain, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(p_remat), jax.tree.leaves(p_plain)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    """),
    md("""
    `vg.applied(...)` shows what was planned and applied: the graph, the plan, and the bytes
    the transformed step saves for the backward pass, predicted and realised.
    """),
    code("""
    app = vg.applied(params, x, y)
    print(app.plan.summary(app.graph))
    print(f'saved for backward: predicted {app.predicted_residual_bytes / MIB:.3f} MiB, '
          f'realised {app.residual_bytes / MIB:.3f} MiB '
          f'(no remat: {app.graph.no_remat_peak() / MIB:.3f} MiB peak)')
    """),
    md("""
    ## A scanned transformer

    Deep JAX models scan one block over the layers (`nn.scan`). The `scan_layers` policy plans
    *inside* the scan: which of the block's values each iteration keeps, and how many layers a
    nested-scan group holds. Here a tiny GPT-2 from the zoo with `scan=True`.
    """),
    code("""
    cfg = dict(batch_size=2, seq_len=8, hidden=16, num_layers=4, num_heads=2, vocab_size=32,
               max_len=8, dropout=0.0)
    gloss, gparams, gbatch = remat.zoo.get('gpt2_small', scan=True, **cfg)
    gvg = remat.value_and_grad(gloss, policies.get('scan_layers', budget='90%'))
    gplain_step, gplanned_step = jax.jit(jax.value_and_grad(gloss)), jax.jit(gvg)
    (gval, ggrads), (rval, rgrads) = gplanned_step(gparams, gbatch), gplain_step(gparams, gbatch)
    np.testing.assert_allclose(gval, rval, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(ggrads), jax.tree.leaves(rgrads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    gapp = gvg.applied(gparams, gbatch)
    print('scan decisions:', gapp.plan.meta['scans'])
    print(f"predicted peak {gapp.plan.meta['peak_bytes']} B <= budget {gapp.plan.meta['budget']} B")
    assert gapp.plan.meta['scans'] and gapp.plan.meta['peak_bytes'] <= gapp.plan.meta['budget']
    """),
    code("""
    def gtrain(step, params, steps=3):
        opt = optax.sgd(0.1)
        state = opt.init(params)
        losses = []
        for _ in range(steps):
            value, grads = step(params, gbatch)
            updates, state = opt.update(grads, state, params)
            params = optax.apply_updates(params, updates)
            losses.append(float(value))
        return losses

    gplain, gplanned = gtrain(gplain_step, gparams), gtrain(gplanned_step, gparams)
    print('plain  ', np.round(gplain, 6))
    print('planned', np.round(gplanned, 6))
    np.testing.assert_allclose(gplanned, gplain, rtol=1e-5)
    print('dropin training: OK, losses equal the plain loop (MLP and scanned GPT-2)')
    """),
]

# --------------------------------------------------------------------------------------------
OWN_GRAPH = [
    md("""
    # 04 · Your own graph

    Policies work on any training graph, not only on ones extracted from JAX: load a graph in
    the networkx node-link JSON that Checkmate and Moccasin publish (nodes with `name`,
    `backward`, `cost_cpu`, `cost_ram`), plan it, and export the plan.

    This notebook uses the published VGG16 graph from `shared/benchmarks/checkmate-graphs` when
    that folder sits next to the repository; otherwise it writes a small graph in the same format
    and loads it back.
    """),
    code(SETUP, """
    fmt = remat.errors.format_bytes  # 1536 -> '1.50 KiB'
    import json
    from pathlib import Path
    """),
    code("""
    repo = Path(remat.__file__).resolve().parents[1]
    published = repo.parent / 'shared' / 'benchmarks' / 'checkmate-graphs' / 'VGG16_b256_224x224_train.json'
    if published.exists():
        path = published
    else:  # a 6-layer chain and its backward pass, in Checkmate's attribute names
        L = 6
        nodes = [dict(id=i, name=f'layer{i}', backward=False, cost_cpu=1.0 + i % 2,
                      cost_ram=1000 * (1 + i % 3)) for i in range(L)]
        nodes += [dict(id=L + i, name=f'grad_layer{L - 1 - i}', backward=True, cost_cpu=2.0,
                       cost_ram=1000) for i in range(L)]
        links = [dict(source=i, target=i + 1) for i in range(2 * L - 1)]
        links += [dict(source=L - 1 - i, target=L + i) for i in range(1, L)]  # saved activations
        path = Path('my_graph.json')
        path.write_text(json.dumps(dict(directed=True, multigraph=False, graph={},
                                        nodes=nodes, links=links)))
    graph = remat.load_graph(path)
    print(path.name, '->', graph.summary())
    print('costs are in', graph.meta.get('cost_unit'))
    """),
    md("""
    ## Plan it

    Ask for an impossible budget first: the `InfeasibleBudgetError` says what the smallest
    feasible one is, so you know the range worth planning in.
    """),
    code("""
    try:
        policies.get('checkmate', time_limit=10.0).plan(graph, budget=1)
    except InfeasibleBudgetError as e:
        floor = e.min_feasible_bytes
    print(f'checkpoint-all peak {fmt(graph.no_remat_peak())}, smallest feasible budget '
          f'{fmt(floor)} ({100 * floor / graph.no_remat_peak():.0f}%)')
    """),
    code("""
    BUDGET = '90%'
    assert remat.resolve_budget(BUDGET, graph) >= floor
    budget_bytes = remat.resolve_budget(BUDGET, graph)
    plans, reports = {}, {}
    for name, pol in {'checkmate': policies.get('checkmate', time_limit=10.0),
                      'greedy_remat': policies.get('greedy_remat'),
                      'chain_dp': policies.get('chain_dp'),
                      'sqrtn': policies.get('sqrtn')}.items():
        try:
            plan = pol.plan(graph, budget=BUDGET)
        except NotApplicableError as e:  # e.g. ChainDP on a graph that is not a chain
            print(f'{name:13s} n/a: {str(e)[:70]}')
            continue
        except InfeasibleBudgetError as e:
            assert e.min_feasible_bytes > budget_bytes
            print(f'{name:13s} infeasible: needs {fmt(e.min_feasible_bytes)}')
            continue
        rep = remat.simulate(graph, plan)
        assert rep.peak_bytes <= budget_bytes, (name, rep.peak_bytes, budget_bytes)
        plans[name], reports[name] = plan, rep
        print(f"{name:13s} {plan.meta['status']:10s} peak {fmt(rep.peak_bytes):>11} "
              f"(budget {fmt(budget_bytes)}), overhead {rep.overhead:.3f}x, "
              f"solve {plan.meta['solve_time_s']:.2f} s")
    assert len(plans) >= 2
    """),
    md("""
    ## Export a plan

    A plan is Checkmate's pair of boolean matrices: `R[t, i]` (compute node `i` in step `t`)
    and `S[t, i]` (node `i`'s output is kept entering step `t`). Write them as JSON lists of
    node names per step, for another tool, and check the file describes the same schedule.
    """),
    code("""
    best = min(plans, key=lambda n: reports[n].overhead)
    plan = plans[best]
    names = [v.name for v in graph.nodes]
    exported = {
        'graph': graph.name, 'policy': best, 'budget_bytes': int(budget_bytes),
        'status': plan.meta['status'], 'peak_bytes': int(reports[best].peak_bytes),
        'compute': [[names[i] for i in np.flatnonzero(row)] for row in plan.R],
        'keep': [[names[i] for i in np.flatnonzero(row)] for row in plan.S],
    }
    Path('plan.json').write_text(json.dumps(exported))
    print(f"{best}: {len(exported['compute'])} steps written to plan.json "
          f"({Path('plan.json').stat().st_size} bytes)")

    # read it back into a Plan and replay it: same peak, same compute
    back = json.loads(Path('plan.json').read_text())
    index = {n: i for i, n in enumerate(names)}
    R = np.zeros_like(plan.R)
    S = np.zeros_like(plan.S)
    for t, (comp, keep) in enumerate(zip(back['compute'], back['keep'])):
        R[t, [index[n] for n in comp]] = True
        S[t, [index[n] for n in keep]] = True
    rep2 = remat.simulate(graph, remat.Plan(R=R, S=S, meta={'policy': best}))
    assert rep2.peak_bytes == back['peak_bytes'] and rep2.compute_time_s == reports[best].compute_time_s
    fig = plotstyle.plot_timelines(reports, budget_bytes=budget_bytes, title=graph.name)
    print(f'your own graph: OK, {len(plans)} plans fit, {best} exported and replayed')
    """),
]

# --------------------------------------------------------------------------------------------
NNX_TRAINING = [
    md("""
    # 05 · Training a Flax nnx model with `remat.nnx.value_and_grad`

    Flax's nnx differentiates Modules: `nnx.value_and_grad(loss_fn)(model, batch)` returns the
    loss and the `nnx.State` of the model's `nnx.Param` gradients, and writes updated
    variables (BatchNorm statistics, RNG counters) back into the model.
    `remat.nnx.value_and_grad(loss_fn, policy, budget=...)` has the same shape and plans the
    recomputation first. Below, one `nnx.Optimizer` loop under `nnx.jit` runs with either
    gradient; losses, parameters and batch statistics must agree.
    """),
    code("""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx
    import remat
    MIB = 2**20
    """),
    code("""
    class MLP(nnx.Module):
        def __init__(self, rngs, width=64, depth=8):
            self.inp = nnx.Linear(16, width, rngs=rngs)
            self.bn = nnx.BatchNorm(width, rngs=rngs)
            self.layers = nnx.List([nnx.Linear(width, width, rngs=rngs) for _ in range(depth)])
            self.out = nnx.Linear(width, 10, rngs=rngs)

        def __call__(self, x):
            h = jax.nn.relu(self.bn(self.inp(x)))
            for layer in self.layers:
                h = jax.nn.relu(layer(h))
            return self.out(h)

    def loss_fn(model, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((64, 16)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 10, 64))
    """),
    md("""
    `vg.applied(model, x, y)` plans once per model structure and batch shape (the training
    step below reuses it): Checkmate's MILP at 60% of the step without remat. The budget is the
    compiled step's temp bytes where the compiler keeps `jax.checkpoint` (GPU, TPU; XLA:CPU with
    `XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander`; `app.rounds` lists each compile),
    and the graph's modelled peak, with a warning, where it does not.
    """),
    code("""
    vg = remat.nnx.value_and_grad(loss_fn, 'checkmate', budget='60%')
    app = vg.applied(MLP(nnx.Rngs(0)), x, y)
    print(app.plan.summary(app.graph))
    print(f'saved for backward: predicted {app.predicted_residual_bytes / MIB:.3f} MiB, '
          f'realised {app.residual_bytes / MIB:.3f} MiB '
          f'(no remat: {app.graph.no_remat_peak() / MIB:.3f} MiB peak)')
    for r in app.rounds:
        print(f'internal budget {r.internal_budget} B -> compiled temp {r.compiled_temp} B')
    """),
    md("## The same `nnx.Optimizer` loop with either gradient"),
    code("""
    def train(value_and_grad_fn, steps=8):
        model = MLP(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

        @nnx.jit
        def step(model, optimizer, x, y):
            loss, grads = value_and_grad_fn(model, x, y)  # BatchNorm stats written back
            optimizer.update(model, grads)
            return loss

        return model, [float(step(model, optimizer, x, y)) for _ in range(steps)]

    model, losses = train(vg)
    ref_model, ref_losses = train(nnx.value_and_grad(loss_fn))
    print('remat.nnx         ', np.round(losses, 5))
    print('nnx.value_and_grad', np.round(ref_losses, 5))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(ref_model))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)  # params and batch stats
    print(f'nnx training: OK, loss {losses[0]:.4f} -> {losses[-1]:.4f}, as nnx.value_and_grad')
    """),
]

NOTEBOOKS = {
    "01_policy_tour": POLICY_TOUR,
    "02_budget_sweep": BUDGET_SWEEP,
    "03_dropin_training": DROPIN,
    "04_your_own_graph": OWN_GRAPH,
    "05_nnx_training": NNX_TRAINING,
}


def build(name: str) -> nbformat.NotebookNode:
    """The notebook ``name`` (a key of :data:`NOTEBOOKS`), without outputs."""
    nb = new_notebook(cells=[nbformat.from_dict(dict(c)) for c in NOTEBOOKS[name]])
    for k, cell in enumerate(nb.cells):  # stable ids: regenerating changes nothing
        cell["id"] = f"{name[:2]}-{k:02d}"
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    return nb


def main() -> None:
    for name in NOTEBOOKS:
        path = HERE / f"{name}.ipynb"
        nbformat.write(build(name), path)
        print("wrote", path)


if __name__ == "__main__":
    main()
