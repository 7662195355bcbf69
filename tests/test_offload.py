"""Paging through ``jax.checkpoint`` offloading (issue #33, item 5; :mod:`remat.offload`).

On this CPU XLA compiles the offloading annotations but keeps every buffer in device memory, so
the probe says False and the drop-in keeps POET's page-outs on the device, with a note and a
warning.  The offloading itself is tested at the JAX level, where it is backend independent: the
interpreter with the tags (the function the drop-in builds where offloading is realised) gives
the gradients of ``jax.value_and_grad`` and saves exactly the paged values as host copies
(``device_put`` residuals) and everything else as before.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
from helpers.mlp_models import mlp_setup, tanh_mlp_loss

import policies
import remat
from remat import offload
from remat._jax_compat import name_primitive, saved_residuals
from remat.apply import apply_plan
from remat.compiled_budget import plan_key
from remat.fidelity import RematFidelityWarning
from remat.interpreter import as_function, interpreter
from remat.segments import plan_segments

RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture(scope="module")
def mlp():
    params, batch = mlp_setup(6, 32, 16)
    return params, batch, remat.extract(tanh_mlp_loss, params, batch)


@pytest.fixture(scope="module")
def poet_plan(mlp):
    """POET on the Cortex-M0 profile at 80% of the modelled peak: it pages forward values (the
    SD card costs less energy than recomputing on a 0.17 MFLOP/s core)."""
    _, _, g = mlp
    plan = policies.Poet(device="cortex-m0", budget="80%", time_limit=30).plan(g)
    assert forward_page_outs(g, plan), "POET no longer pages here: pick another budget"
    return plan


def forward_page_outs(g, plan) -> list[int]:
    fwd = ~g.is_backward_array
    return [i for i in offload.paged_nodes(g, plan) if fwd[i]]


def close(got, want):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)


def residuals(fn, *args) -> list[tuple[int, str]]:
    """``(bytes, description)`` of what ``jax.vjp(fn)`` saves, arguments excluded."""
    return [(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize, d)
            for a, d in saved_residuals(fn, *args) if "argument" not in d]


def offloaded(res) -> int:
    return sum(b for b, d in res if "device_put" in d)


def tagged_function(g, segs, nodes):
    """The forward program with ``segs`` and the values of ``nodes`` offloaded at segment
    boundaries: the function the drop-in builds where offloading is realised."""
    prog = g.program
    off = offload.boundary_values(prog.forward, prog.fwd_node, segs, nodes)
    fn = as_function(interpreter(prog.forward, segs, offload=off.tags), prog.arg_shapes,
                     prog.fwd_out_tree)
    return fn, off


# --------------------------------------------------------------------------- the policy
def test_policy_offloads_the_tagged_names_and_recomputes_the_rest():
    pol = offload.policy([offload.tag_name(3), offload.tag_name(7)])
    aval = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    got = pol(name_primitive(), aval, name=offload.tag_name(3))
    assert isinstance(got, jax.ad_checkpoint.Offloadable)
    assert (got.src, got.dst) == ("device", "pinned_host")
    assert pol.offloaded_names == {"remat_page_3", "remat_page_7"} and not pol.saveable_names
    # every other value is recomputed, as the segment's nothing_saveable did
    assert pol(name_primitive(), aval, name="other") is jax.ad_checkpoint.Recompute
    assert pol(jax.lax.tanh_p, aval) is jax.ad_checkpoint.Recompute


def test_policy_in_a_checkpoint_offloads_exactly_the_tagged_value():
    pol = offload.policy([offload.tag_name(0)])

    def f(w, x):
        def seg(w, h):
            a = jnp.tanh(offload.tag(h, 0) @ w)  # tagged: offloaded
            b = jnp.sin(offload.tag(a, 1) @ w)  # tagged with another name: recomputed
            return jnp.sum(b * b)

        return jax.checkpoint(seg, policy=pol)(w, x @ w)  # a dot's derivative needs no h

    w, x = jnp.full((8, 8), 0.1), jnp.ones((4, 8))
    res = residuals(f, w, x)
    assert offloaded(res) == 4 * 8 * 4, res  # h, to pinned_host
    assert sum(b for b, _ in res) == 4 * 8 * 4, res  # nothing else: a and b are recomputed
    close(jax.value_and_grad(f)(w, x),
          jax.value_and_grad(lambda w, x: jnp.sum(jnp.sin(jnp.tanh(x @ w @ w) @ w) ** 2))(w, x))


# --------------------------------------------------------------------------- the probe
def test_probe_says_cpu_does_not_offload():
    assert offload.realised("cpu") is False
    assert offload.realised("cpu") is False  # cached


def test_host_memory_used_reads_the_compiled_step():
    @dataclasses.dataclass
    class Stats:
        host_temp_size_in_bytes: int

    @dataclasses.dataclass
    class Compiled:
        host: int
        text: str

        def memory_analysis(self):
            return Stats(self.host)

        def as_text(self):
            return self.text

    assert offload.host_memory_used(Compiled(1024, ""))
    assert offload.host_memory_used(Compiled(0, "f32[512,256]{1,0:S(5)} copy-start"))
    assert not offload.host_memory_used(Compiled(0, "f32[512,256]{1,0} copy"))


# --------------------------------------------------------------------------- the drop-in on CPU
def test_poet_page_outs_through_the_drop_in_equal_jax_and_are_noted(mlp, poet_plan):
    params, batch, g = mlp
    with pytest.warns(RematFidelityWarning, match="paging not realised on this backend"):
        app = apply_plan(tanh_mlp_loss, (params, batch), None, graph=g, plan=poet_plan)
    assert app.offloaded_bytes == 0
    assert any("paging not realised on this backend (cpu" in n and "page-outs kept on the device"
               in n for n in app.notes), app.notes
    assert any("paging not realised" in w for w in app.warnings)
    assert offloaded(residuals(app.fn, params, batch)) == 0  # kept on the device, as before
    close(jax.jit(jax.value_and_grad(app.fn))(params, batch),
          jax.jit(jax.value_and_grad(tanh_mlp_loss))(params, batch))


def test_poet_policy_as_the_drop_in_argument(mlp):
    params, batch, _ = mlp
    vg = remat.value_and_grad(tanh_mlp_loss, policies.Poet(device="cortex-m0", budget="80%",
                                                           time_limit=30))
    with pytest.warns(RematFidelityWarning, match="paging not realised"):
        got = jax.jit(vg)(params, batch)
    close(got, jax.value_and_grad(tanh_mlp_loss)(params, batch))
    app = vg.applied(params, batch)
    assert app.plan.paging and app.offloaded_bytes == 0


# --------------------------------------------------------------------------- the tagged function
def test_tagged_poet_step_offloads_the_paged_values_and_equals_jax(mlp, poet_plan):
    params, batch, g = mlp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RematFidelityWarning)
        app = apply_plan(tanh_mlp_loss, (params, batch), None, graph=g, plan=poet_plan)
    fn, off = tagged_function(g, app.segments, forward_page_outs(g, poet_plan))
    assert off.tags and off.offloaded_bytes > 0 and off.kept_bytes == 0
    res, plain = residuals(fn, params, batch), residuals(app.fn, params, batch)
    assert offloaded(res) == off.offloaded_bytes
    # the same residuals as without offloading: only where the paged ones live changed
    assert sorted(b for b, _ in res) == sorted(b for b, _ in plain)
    step = jax.jit(jax.value_and_grad(fn)).lower(params, batch).compile()
    close(step(params, batch), jax.jit(jax.value_and_grad(tanh_mlp_loss))(params, batch))


def test_tagged_nested_segments_keep_their_recomputation(mlp):
    """Offloading kept values of a plan that recomputes (nested checkpoints): the segments'
    residuals are unchanged, the paged ones move to the host, gradients equal JAX's."""
    params, batch, g = mlp
    counts = np.array([1, 3, 2, 1, 3, 2, 1])  # per forward stage (6 layers and the loss)
    assert int((~g.is_backward_array).sum()) == len(counts)
    prog = g.program
    segs = plan_segments(prog.forward, prog.fwd_node, counts)
    assert any(c.remat for s in segs for c in s.children)  # checkpoints inside checkpoints
    fn, off = tagged_function(g, segs, [0, 3])
    plain = as_function(interpreter(prog.forward, segs), prog.arg_shapes, prog.fwd_out_tree)
    res, res_plain = residuals(fn, params, batch), residuals(plain, params, batch)
    assert off.offloaded_bytes > 0 and offloaded(res) == off.offloaded_bytes
    assert sum(b for b, _ in res) == sum(b for b, _ in res_plain), (res, res_plain)
    close(jax.jit(jax.value_and_grad(fn))(params, batch),
          jax.jit(jax.value_and_grad(tanh_mlp_loss))(params, batch))


def test_boundary_values_tag_only_checkpointed_readers(mlp, poet_plan):
    _, _, g = mlp
    prog = g.program
    nodes = forward_page_outs(g, poet_plan)
    nfwd = int((~g.is_backward_array).sum())
    ones = np.ones(nfwd, np.int64)
    trimmed = plan_segments(prog.forward, prog.fwd_node, ones)
    off = offload.boundary_values(prog.forward, prog.fwd_node, trimmed, nodes)
    pos = {o: k for k, e in enumerate(prog.forward.eqns) for o in e.outs}
    seg_of = {(s.start, s.stop, s.level): s for s in trimmed}
    assert off.tags
    for key, vals in off.tags.items():
        s = seg_of[key]
        assert s.remat and s.level == 1
        for v in vals:  # a paged node's value produced before the segment and read in it
            assert int(prog.fwd_node[pos[v]]) in nodes and pos[v] < s.start
            assert any(v in e.ins for e in prog.forward.eqns[s.start:s.stop])
    # untrimmed kept stages run without jax.checkpoint: nothing to tag, all left on the device
    plain = plan_segments(prog.forward, prog.fwd_node, ones, trim=False)
    off2 = offload.boundary_values(prog.forward, prog.fwd_node, plain, nodes)
    assert not off2.tags and off2.offloaded_bytes == 0
    assert off2.kept_bytes == off.offloaded_bytes


# --------------------------------------------------------------------------- a backend that offloads
def test_realised_paging_is_recorded_in_applied(mlp, poet_plan, monkeypatch):
    """The drop-in's bookkeeping where the probe says the backend offloads (simulated here by
    the probe's answer; XLA:CPU then compiles the annotations without moving anything)."""
    params, batch, g = mlp
    monkeypatch.setattr(offload, "realised", lambda platform=None: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematFidelityWarning)  # nothing left on the device
        app = apply_plan(tanh_mlp_loss, (params, batch), None, graph=g, plan=poet_plan)
    assert app.offloaded_bytes > 0
    assert any(n.startswith(f"paging: {app.offloaded_bytes} bytes to pinned_host")
               for n in app.notes), app.notes
    assert not any("not realised" in n for n in app.notes)
    assert offloaded(residuals(app.fn, params, batch)) == app.offloaded_bytes
    close(jax.jit(jax.value_and_grad(app.fn))(params, batch),
          jax.jit(jax.value_and_grad(tanh_mlp_loss))(params, batch))


# --------------------------------------------------------------------------- the closed loop's key
def test_plan_key_tells_paging_apart_only_where_it_is_offloaded(poet_plan):
    @dataclasses.dataclass
    class App:
        plan: object
        offloaded_bytes: int = 0

    other = dataclasses.replace(poet_plan, page_out=np.zeros_like(poet_plan.page_out))
    assert plan_key(App(poet_plan)) == plan_key(App(other))  # kept on the device: same step
    assert plan_key(App(poet_plan, 1)) != plan_key(App(other, 1))
    assert plan_key(App(poet_plan, 1)) == plan_key(App(poet_plan, 1))
