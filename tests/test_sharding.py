"""Sharded steps (``remat.sharding``, #36): per-device graphs, collectives and budgets.

The sharded work runs in subprocesses (one per part) with 8 host devices and XLA:CPU's
``cse_barrier_expander`` off (``XLA_FLAGS`` must be set before JAX starts; this process's
environment is never changed).  Layouts (``experiments/sharded_budget.py``): data parallel,
FSDP and 2-way tensor x 4-way data parallel, on a tanh MLP and a plain-JAX transformer, and the
FSDP layout on a Flax linen transformer (``nn.MultiHeadDotProductAttention``).  Each
applied step, run under ``jax.jit`` with the sharded arguments, must give the unsharded
``jax.value_and_grad``'s value and gradients (rtol 1e-4) and compile to a per-device temp within
the per-device budget, or the drop-in raises a typed error naming a
larger smallest budget, never a silent no-saving step.  Inside ``shard_map`` (``check_vma=False``:
the drop-in re-binds equations traced outside it) the body is a per-device program and is
planned as one.
"""

from __future__ import annotations

import functools

import pytest
from helpers.xla_subprocess import run_json

from remat.core.devices import DeviceProfile, DeviceProfileError
from remat.core.devices import get as get_profile
from remat.measurement import FLAG
from remat.sharding import collective_time, collectives

pytestmark = pytest.mark.slow

DEVICES8 = "--xla_force_host_platform_device_count=8 " + FLAG

# (layout, model, budget, must fit): the one-block transformer's plans, the one that recomputes
# nothing included, compile to 0.65x of its no-remat temp at best under FSDP (jax 0.12), so it
# is held to 85% and refused at 50% (two blocks fit at 0.49x: the experiment); the one-block Flax
# transformer under FSDP is held to 85% too (at 70% it fits at 0.97x of the budget on jax 0.12,
# but on jax 0.8 its smallest compiled plan is 8% over the budget and the drop-in refuses it);
# the tp2xdp4 MLP at 75% (its smallest plan compiles to 0.67x of the no-remat temp on jax 0.12,
# 0.71x on jax 0.8: the row-parallel partial sums)
CASES = (("dp", "mlp", "50%", True), ("fsdp", "mlp", "50%", True),
         ("tp2xdp4", "mlp", "75%", True), ("dp", "transformer", "85%", True),
         ("fsdp", "transformer", "85%", True), ("tp2xdp4", "transformer", "85%", True),
         ("fsdp", "transformer", "50%", False), ("fsdp", "flax_transformer", "85%", True))

_HEADER = """
import json, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, "tests")
from helpers.limits import pinned_host_profile
pinned_host_profile().__enter__()  # the same stage costs, plans and modelled times on any machine
import jax, jax.numpy as jnp, numpy as np
import remat
from remat.core.errors import InfeasibleBudgetError
from experiments.sharded_budget import run_case, _models, _layout, fsdp_choices
assert len(jax.devices()) == 8
out = {}
loss, params, x = _models(128, 8192, only="mlp")["mlp"]
ps, xs = _layout("fsdp", params, x)
"""
#: one subprocess per part, each read by the tests that need it (parts run in parallel on
#: the workers; one script for all made every worker that got one of its tests run all of it)
_PARTS = {
    "mlp_rows": f"out['rows'] = [run_case(l, m, b) for l, m, b, _ in {[c for c in CASES if c[1] == 'mlp']!r}]",
    "other_rows": f"out['rows'] = [run_case(l, m, b, blocks=1) for l, m, b, _ in "
                  f"{[c for c in CASES if c[1] != 'mlp']!r}]",
    "fsdp_choices": "out['fsdp_choices'] = fsdp_choices('mlp', '50%')",
    "graph": """
g = remat.extract(loss, *remat.sharding.abstract((ps, xs)))
pg = remat.sharding.per_device_graph(g, remat.sharding.abstract((ps, xs)))
sh = pg.meta["sharding"]
out["graph"] = dict(global_param=g.param_bytes, param=pg.param_bytes, global_input=g.input_bytes,
                    input=pg.input_bytes, n_gathered=len(sh["gathered_args"]),
                    kinds=sorted({c.kind for c in sh["collectives"]}),
                    gather_times=[c.time_s for c in sh["collectives"] if c.kind == "all-gather"],
                    fwd_times=[(n.time_s, o.time_s) for n, o in zip(pg.nodes, g.nodes)
                               if not n.is_backward and n.param_bytes])
# tensor parallelism: the row-parallel layers' forward all-reduces, charged to their nodes
tp = {}
for lay in ("dp", "tp2xdp4"):
    a = remat.sharding.abstract(_layout(lay, params, x))
    pt = remat.sharding.per_device_graph(remat.extract(loss, *a), a)
    nc = pt.meta["sharding"]["node_collectives"]
    tp[lay] = dict(
        charged=sorted((int(i), c.kind, c.bytes, c.group, c.time_s, pt.nodes[i].time_s)
                       for i, cs in nc.items() for c in cs),
        hlo=sorted((c.bytes, c.group) for c in pt.meta["sharding"]["collectives"]
                   if c.kind == "all-reduce"))
tp["link_bw"] = remat.devices.for_backend().link_bw
# Flax linen (nn.MultiHeadDotProductAttention, heads over `model`): two blocks, each with two
# row-parallel contractions (the attention's output projection and the MLP's second Dense)
fl, fp, fx = _models(128, 8192, 2, only="flax_transformer")["flax_transformer"]
a = remat.sharding.abstract(_layout("tp2xdp4", fp, fx))
pt = remat.sharding.per_device_graph(remat.extract(fl, *a), a)
tp["flax"] = sorted([c.bytes, c.group] for cs in pt.meta["sharding"]["node_collectives"].values()
                    for c in cs)
out["tp"] = tp

""",
    "jit": """
# inside jax.jit without a plan made at the sharded arguments: a warning, never silence
vg = remat.value_and_grad(loss, "sqrtn")  # no budget: no compile loop, the warning is the point
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    jax.jit(vg).lower(ps, xs)
out["jit_warnings"] = [str(m.message) for m in w if "not visible" in str(m.message)]

""",
    "shard_map": """
# inside shard_map: the body is a per-device program; planned there, per device
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map
from jax.sharding import Mesh, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
vg2 = remat.value_and_grad(loss, "checkmate", budget="70%")
pm = lambda t: jax.lax.pmean(t, "data")
def body(ws, xb):
    v, gr = vg2(ws, xb)
    return pm(v), jax.tree_util.tree_map(pm, gr)
def ref_body(ws, xb):
    v, gr = jax.value_and_grad(loss)(ws, xb)
    return pm(v), jax.tree_util.tree_map(pm, gr)
sm = lambda f: jax.jit(shard_map(f, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P()),
                                 check_vma=False))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    v, gr = sm(body)(params, x)
v0, g0 = jax.value_and_grad(loss)(params, x)
out["shard_map"] = dict(
    err=max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b))) for a, b in zip(gr, g0)),
    value_err=abs(float(v) - float(v0)) / abs(float(v0)),
    temp=int(sm(body).lower(params, x).compile().memory_analysis().temp_size_in_bytes),
    ref_temp=int(sm(ref_body).lower(params, x).compile().memory_analysis().temp_size_in_bytes),
    warnings=[str(m.message) for m in w if "not visible" in str(m.message)])
""",
}


@functools.cache
def _sharded(part: str) -> dict:
    """The JSON a part of the script prints (8 host devices, the flag on)."""
    return run_json(_HEADER + _PARTS[part] + "\nprint(json.dumps(out))\n", flags=DEVICES8,
                    timeout=900)


def _check_rows(rows, cases):
    assert len(rows) == len(cases)
    for (layout, model, budget, must_fit), r in zip(cases, rows):
        assert (r["layout"], r["model"], r["budget"]) == (layout, model, budget)
        frac = float(budget.rstrip("%")) / 100
        assert abs(r["budget_bytes"] - frac * r["no_remat_temp"]) <= 1, r  # per device
        if not must_fit:
            assert r["status"] == "infeasible", r
            min_feasible = int(r["error"].split("min_feasible_bytes=")[1])
            assert min_feasible > r["budget_bytes"], r
            continue
        assert r["status"] == "fit", r
        assert r["compiled_temp"] <= r["budget_bytes"], r
        assert r["compiled_temp"] < 0.95 * r["no_remat_temp"], r  # a real saving
        assert r["grad_max_rel_err"] < 1e-4, r
    return {(r["layout"], r["model"]): r for r in rows}


def test_sharded_mlp_steps_within_per_device_budgets_and_predicted_without_compiling():
    """The MLP in the three layouts: unsharded gradients, the per-device budget, FSDP's
    gathered weights.  ``remat.sharded_memory`` predicts the per-device temp from the step's
    program at per-device shapes: under 2-way tensor parallelism the row-parallel matmuls'
    partial sums and their all-reduced copies are both buffers (without them the no-remat
    prediction is 0.87x); in the plan's backward pass XLA combines two independent
    all-reduces into one, so both partial sums live until the later one (without the
    combiner rule the plan is predicted at 0.80x)."""
    by = _check_rows(_sharded("mlp_rows")["rows"], [c for c in CASES if c[1] == "mlp"])
    assert "all-gather" in by["fsdp", "mlp"]["collectives"]
    assert by["fsdp", "mlp"]["gathered_bytes"] == 8 * 128 * 128 * 4
    assert by["dp", "mlp"]["gathered_bytes"] == 0
    for layout in ("dp", "fsdp", "tp2xdp4"):
        r = by[layout, "mlp"]
        assert abs(r["predicted_no_remat_temp"] / r["no_remat_temp"] - 1) <= 0.1, r
        assert abs(r["predicted_temp"] / r["compiled_temp"] - 1) <= 0.1, r  # the applied plan


def test_sharded_transformer_steps_give_unsharded_gradients_within_per_device_budgets():
    by = _check_rows(_sharded("other_rows")["rows"], [c for c in CASES if c[1] != "mlp"])
    # Flax FSDP: the q/k/v/out and MLP kernels are gathered (64x64 each but the MLP's 64x256)
    assert "all-gather" in by["fsdp", "flax_transformer"]["collectives"]
    assert by["fsdp", "flax_transformer"]["gathered_bytes"] == (4 * 64 * 64 + 2 * 64 * 256) * 4


def test_per_device_graph_counts_shards_gathers_and_collective_time():
    g = _sharded("graph")["graph"]
    assert g["param"] * 8 == g["global_param"]  # FSDP: each device holds 1/8 of the weights
    assert g["input"] * 8 == g["global_input"]  # the batch over 8 devices
    assert g["n_gathered"] == 8
    assert "all-gather" in g["kinds"] and all(t > 0 for t in g["gather_times"])
    # a node reading a gathered weight pays the gather: recomputing it regathers
    assert g["fwd_times"] and all(t > 0 for t, _ in g["fwd_times"])


def test_a_row_parallel_layer_pays_its_forward_all_reduce_when_recomputed():
    """Tensor parallelism (the 8-layer MLP, weights alternately column- and row-sharded over a
    2-device ``model`` axis; then the 2-block Flax linen transformer): each row-parallel matmul writes partial sums that an all-reduce
    completes.  The per-device graph charges each such all-reduce (ring time at the profile's
    link bandwidth) to the node holding the matmul, with the bytes and group of the compiled
    no-remat step's all-reduces; data parallelism charges none (its one all-reduce, of the
    weight gradients, is the backward's)."""
    tp = _sharded("graph")["tp"]
    assert tp["dp"]["charged"] == [] and len(tp["dp"]["hlo"]) == 1
    charged = tp["tp2xdp4"]["charged"]
    assert len(charged) == 4  # the four row-parallel layers of eight
    # the compiled step runs them (and the backward's of the same size and group)
    assert tp["tp2xdp4"]["hlo"].count([8192 // 4 * 128 * 4, 2]) >= 4
    for _node, kind, nbytes, group, t, node_time in charged:
        assert kind == "all-reduce" and group == 2 and nbytes == 8192 // 4 * 128 * 4
        assert t == pytest.approx(collective_time("all-reduce", nbytes, 2, tp["link_bw"]))
        assert node_time >= t > 0
    # a Flax transformer the project did not write: its 4 row-parallel einsums, 1 MiB each
    assert tp["flax"] == [[1 << 20, 2]] * 4


def test_fsdp_plan_regathers_where_keeping_the_gathered_weights_does_not_fit():
    """FSDP MLP at 50%: the plan recomputes stages that read a gathered weight (each
    recomputation regathers); the same plan keeping them fits neither the modelled nor the
    compiled budget, and costs less modelled time."""
    rows = {r["choice"]: r for r in _sharded("fsdp_choices")["fsdp_choices"]}
    assert set(rows) == {"chosen", "keep", "keep_untrimmed"}
    ch, keep, raw = rows["chosen"], rows["keep"], rows["keep_untrimmed"]
    assert ch["regathered_nodes"] > 0 and ch["fits"], ch
    assert keep["regathered_nodes"] == 0 and keep["modelled_gathers"] == 8, keep
    assert ch["modelled_gathers"] > keep["modelled_gathers"]
    assert ch["modelled_gather_s"] > keep["modelled_gather_s"] > 0
    assert ch["modelled_time_s"] > keep["modelled_time_s"]
    assert keep["modelled_peak"] > keep["planned_budget"] >= ch["modelled_peak"], (keep, ch)
    for r in (keep, raw):  # kept: over the per-device budget, compiled and predicted
        assert not r["fits"] and r["compiled_temp"] > 1.5 * ch["compiled_temp"], r
        assert r["predicted_temp"] > r["budget_bytes"], r
    # kept stages run as is: XLA keeps the gathered weights (one all-gather each)
    assert raw["all_gathers"] == 8 < ch["all_gathers"], (raw, ch)
    assert all(r["grad_max_rel_err"] < 1e-4 for r in rows.values()), rows


def test_jit_without_visible_shardings_warns():
    assert _sharded("jit")["jit_warnings"], "planning inside jax.jit on a mesh must say it is not per device"


def test_inside_shard_map_the_body_is_planned_per_device():
    r = _sharded("shard_map")["shard_map"]
    assert r["err"] < 1e-4 and r["value_err"] < 1e-5, r
    # the budget is 70% of the body's temp inside the drop-in; ref_temp is the whole shard_map
    # step's, compiled apart
    assert r["temp"] <= 0.75 * r["ref_temp"], r
    assert r["warnings"] == [], r  # manual axes: no "not per device" warning


# ------------------------------------------------------------------ no devices needed
_HLO = """
  %all-gather.3 = f32[1024,1024]{1,0} all-gather(%param.4), channel_id=4, replica_groups=[1,8]<=[8], dimensions={0}, metadata={op_name="ws[3]"}
  %all-reduce.17 = (f32[], f32[64,64]{1,0}, f32[64,64]{1,0}) all-reduce(%a, %b, %c), channel_id=18, replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
  %ags = (f32[128,64]{1,0}, f32[1024,64]{1,0}) all-gather-start(%p), replica_groups=mesh['data'=4,'model'=2] {'data'}, dimensions={0}
  %agd = f32[1024,64]{1,0} all-gather-done(%ags)
  %rs = bf16[8,16]{1,0} reduce-scatter(%x), replica_groups=[4,2]<=[8], dimensions={0}
"""


def test_collectives_are_read_from_hlo_with_bytes_groups_and_ring_times():
    cs = collectives(_HLO, 8, 1e9)
    assert [c.kind for c in cs] == ["all-gather", "all-reduce", "all-gather", "reduce-scatter"]
    assert [c.bytes for c in cs] == [4 * 2**20, 4 + 2 * 64 * 64 * 4, 1024 * 64 * 4, 8 * 16 * 2]
    assert [c.group for c in cs] == [8, 4, 4, 2]
    assert cs[0].name == "ws[3]"
    assert cs[0].time_s == pytest.approx(7 / 8 * 4 * 2**20 / 1e9)
    assert cs[1].time_s == pytest.approx(2 * 3 / 4 * cs[1].bytes / 1e9)
    assert collective_time("all-gather", 1e6, 1, 1e9) == 0.0


def test_interconnect_bandwidth_is_a_profile_field():
    h100 = get_profile("h100-sxm")
    assert h100.link_bw == 450e9
    host_like = get_profile("cortex-a72")
    assert host_like.interconnect_bw is None and host_like.link_bw == host_like.memory_bandwidth
    with pytest.raises(DeviceProfileError):
        DeviceProfile(**{**h100.__dict__, "interconnect_bw": -1.0})


def test_independent_all_reduces_over_the_same_axes_are_combined():
    """XLA:CPU's combiner on the model's program: the three independent all-reduces over
    ``model`` become one at the last one's place (their readers move after it), the one over
    ``data`` and the one that depends on a member stay apart."""
    from remat import xla_memory as xm
    from remat.sharded_memory import PARTIAL_SUM, _combine_all_reduces

    op = lambda name, ins, outs: xm._Op(name, ins, outs, None)  # noqa: E731
    ops = [op("dot_general", (0,), (1,)), op(PARTIAL_SUM, (1,), (2,)),   # 0, 1: model
           op("tanh", (2,), (3,)),                                        # 2: reads the first
           op("dot_general", (0,), (4,)), op(PARTIAL_SUM, (4,), (5,)),   # 3, 4: model
           op("dot_general", (0,), (6,)), op(PARTIAL_SUM, (6,), (7,)),   # 5, 6: data
           op("dot_general", (0,), (8,)), op(PARTIAL_SUM, (8,), (9,)),   # 7, 8: model
           op("add", (3, 5), (10,)), op(PARTIAL_SUM, (10,), (11,))]      # 9, 10: model, dependent
    keys = {1: ("model",), 4: ("model",), 6: ("data",), 8: ("model",), 10: ("model",)}
    out = _combine_all_reduces(ops, keys)
    sums = [o for o in out if o.name == PARTIAL_SUM]
    assert sorted(len(o.ins) for o in sums) == [1, 1, 3]
    merged = next(o for o in sums if len(o.ins) == 3)
    assert set(merged.ins) == {1, 4, 8} and set(merged.outs) == {2, 5, 9}
    order = {v: t for t, o in enumerate(out) for v in o.outs}
    assert order[3] > order[2] and order[10] > order[3]  # the tanh waits for the combined one
    assert len(out) == len(ops) - 2


def test_forward_partial_sums_rejects_what_is_not_a_forward_program():
    import jax.numpy as jnp

    import remat
    from remat.core.errors import ExtractionError
    from remat.sharded_memory import forward_partial_sums

    with pytest.raises(ExtractionError, match="flattened forward program"):
        forward_partial_sums(object(), ())
    g = remat.extract(lambda w, x: jnp.sum(jnp.tanh(x @ w)), jnp.ones((4, 4)), jnp.ones((2, 4)))
    with pytest.raises(ExtractionError, match="leaves"):
        forward_partial_sums(g.program.forward, (jnp.ones((4, 4)),))
    assert forward_partial_sums(g.program.forward, (jnp.ones((4, 4)), jnp.ones((2, 4)))) == {}


def test_a_weight_sharded_on_the_batchs_axis_is_gathered_for_the_data_gradient():
    """FSDP (weight rows and batch over one ``data`` axis): the data gradient ``ct @ w.T`` would
    shard both its dimensions over ``data``, so XLA all-gathers the weight, the smaller
    operand, as for the forward ``h @ w``.  Without the gather the model ran the data
    gradient before the recomputation that waits for it in XLA (an FSDP Flax MLP at 85 %
    predicted at 1.12x of its compiled per-device temp, now 1.00x)."""
    import jax
    import jax.numpy as jnp

    from remat import xla_memory as xm
    from remat.sharded_memory import GATHER, _per_device

    def loss(ws, x):
        y = jnp.tanh(x @ ws[0]) @ ws[1]
        return jnp.mean(y * y)  # a cotangent of y computed from y: batch-sharded

    ws = (jax.ShapeDtypeStruct((128, 256), jnp.float32),
          jax.ShapeDtypeStruct((256, 128), jnp.float32))
    x = jax.ShapeDtypeStruct((1024, 128), jnp.float32)
    p = xm._flatten(jax.make_jaxpr(jax.value_and_grad(loss))(ws, x))
    fsdp = (("data",), ())  # the first axis over 8 devices: the weights' rows, the batch
    q = _per_device(p, {0: fsdp, 1: fsdp, 2: fsdp}, {"data": 8})
    gathered = {op.outs[0] for op in q.ops if op.name == GATHER}
    w2 = [op for op in q.ops if op.name == "dot_general"
          and any(i in gathered and q.avals[i].shape == (256, 128) for i in op.ins)]
    assert len(w2) == 2, [(op.ins, [q.avals[i].shape for i in op.ins]) for op in q.ops
                          if op.name == "dot_general"]  # the forward and the data gradient
