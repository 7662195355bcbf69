"""A few optax steps of resnet18 (CIFAR size, BatchNorm state as ``has_aux``) with ``policy=``
as a drop-in argument: the loss curve equals the unmodified step's to float tolerance.

The only change to a standard Flax/optax training step is one line::

    vg = jax.value_and_grad(spec.loss_and_state_fn, has_aux=True)            # before
    vg = remat.value_and_grad(spec.loss_and_state_fn, "sqrtn", has_aux=True)  # after

Command (prints both loss curves, their largest difference, and the saved-residual bytes of each
step)::

    XLA_FLAGS=--xla_disable_hlo_passes=cse_barrier_expander \\
        python experiments/train_example.py --steps 5 --batch-size 8 --policy sqrtn

Exits non-zero when the curves differ by more than ``rtol`` (default 1e-4, relative).  It
writes no result file: ``docs/results/apply.md`` quotes what it printed.
"""

from __future__ import annotations

import argparse
import sys
import time


def train(spec, vg, steps: int, lr: float):
    """``steps`` Adam steps with ``vg`` (a value_and_grad with ``has_aux``); returns losses."""
    import jax
    import optax

    tx = optax.adam(lr)

    @jax.jit
    def step(variables, opt_state, batch):
        (loss, state), grads = vg(variables, batch)
        updates, opt_state = tx.update(grads["params"], opt_state, variables["params"])
        params = optax.apply_updates(variables["params"], updates)
        return {**variables, **state, "params": params}, opt_state, loss

    variables, opt_state = spec.variables, tx.init(spec.variables["params"])
    losses = []
    for _ in range(steps):
        variables, opt_state, loss = step(variables, opt_state, spec.batch)
        losses.append(float(loss))
    return losses


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="resnet18 training with a remat policy as drop-in")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--policy", default="sqrtn")
    p.add_argument("--budget", default=None)
    p.add_argument("--width", type=int, default=64, help="resnet18 base width (64 = the real one)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--rtol", type=float, default=1e-4)
    a = p.parse_args(argv)

    import jax

    import remat
    from remat.measurement import residual_bytes

    spec = remat.zoo.get_model("resnet18", batch_size=a.batch_size, width=a.width)
    fn = spec.loss_and_state_fn
    plain = jax.value_and_grad(fn, has_aux=True)
    ours = remat.value_and_grad(fn, a.policy, budget=a.budget, has_aux=True)

    t = time.perf_counter()
    ref = train(spec, plain, a.steps, a.lr)
    t_ref = time.perf_counter() - t
    t = time.perf_counter()
    got = train(spec, ours, a.steps, a.lr)
    t_ours = time.perf_counter() - t

    app = ours.applied(spec.variables, spec.batch)
    rb, _ = residual_bytes(fn, spec.variables, spec.batch)
    rr, _ = residual_bytes(app.fn, spec.variables, spec.batch)
    print(f"resnet18 width={a.width} batch={a.batch_size} 32x32, policy={a.policy} budget={a.budget}")
    print(f"plan: {app.plan.summary(app.graph)}; {len(app.saved)} of {len(app.graph.forward_nodes)} "
          f"forward stages saved, {sum(s.remat for s in app.segments)} checkpoint segments")
    print(f"saved residuals per step: {rb / 2**20:.2f} MiB without, {rr / 2**20:.2f} MiB with the plan")
    print(f"{'step':>4} {'jax.value_and_grad':>20} {'remat.value_and_grad':>22} {'|diff|':>10}")
    worst = 0.0
    for i, (x, y) in enumerate(zip(ref, got)):
        worst = max(worst, abs(x - y) / max(abs(x), 1e-12))
        print(f"{i:>4} {x:>20.7f} {y:>22.7f} {abs(x - y):>10.2e}")
    print(f"largest relative difference {worst:.2e} (tolerance {a.rtol:g}); "
          f"time incl. compile {t_ref:.1f} s vs {t_ours:.1f} s")
    return 0 if worst <= a.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
