"""End to end: extraction + simulation against a hand count, and the CLI on a zoo model."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import policies
import remat
from experiments import cli


class TanhMLP(nn.Module):
    depth: int
    width: int

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth):
            x = jnp.tanh(nn.Dense(self.width, use_bias=False)(x))
        return x


@pytest.mark.parametrize("depth,width,batch", [(4, 16, 8), (8, 32, 64)])
def test_extracted_chain_mlp_checkpoint_all_peak_equals_hand_count(depth, width, batch):
    """Hand count (f32, a = batch*width*4 bytes per activation, w = width*width*4 per weight).

    Forward stage i keeps h_i = tanh(h_{i-1} W_i): the next layer reads it, its own backward
    reads it (tanh' = 1 - h_i^2) and the next layer's backward reads it (dW_{i+1} = h_i^T g).
    A backward stage's output is (g_{i-1}, dW_i), one value of a + w bytes, live until the next
    backward stage has read it.  At the first layer backward (the last layer's) the resident
    values are h_1..h_L (L*a), the incoming gradient g_L (a), and the stage writes g_{L-1} and
    dW_L (a + w): (L + 2)*a + w.  At the second (layer L-1's) h_L is gone: h_1..h_{L-1}
    ((L-1)*a), the previous stage's (g_{L-1}, dW_L) (a + w) and its own (a + w):
    (L + 1)*a + 2*w, larger when w > a.  No other step holds more: later layers hold fewer h's;
    the loss steps hold at most h_1..h_L plus two activation-sized values.
    """
    model = TanhMLP(depth, width)
    x = jax.random.normal(jax.random.PRNGKey(0), (batch, width))
    y = jax.random.normal(jax.random.PRNGKey(1), (batch, width))
    params = model.init(jax.random.PRNGKey(2), x)

    def loss(p, x, y):
        return jnp.mean((model.apply(p, x) - y) ** 2)

    g = remat.extract(loss, params, x, y, stages="module")
    assert len(g.forward_nodes) - len(g.meta.get("loss_nodes", ())) == depth
    a, w = batch * width * 4, width * width * 4
    expected = max((depth + 2) * a + w, (depth + 1) * a + 2 * w)
    assert g.no_remat_peak() == expected
    rep = remat.simulate(g, policies.checkpoint_all_plan(g))
    assert rep.peak_bytes == expected
    # and the executor measures the same on the real arrays
    value, grads, stats = remat.execute(g, policies.checkpoint_all_plan(g), params, x, y)
    ref_v, ref_g = jax.value_and_grad(loss)(params, x, y)
    assert stats.peak_bytes == expected
    assert jnp.allclose(value, ref_v, rtol=1e-5, atol=1e-6)
    for got, ref in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_g)):
        assert jnp.allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_cli_compare_zoo_mlp(tmp_path, capsys):
    png = tmp_path / "mlp.png"
    rc = cli.main([
        "compare", "mlp", "--budget", "60%", "--batch-size", "64", "--plot", str(png),
        "--policies", "checkpoint_all", "sqrtn", "chain_dp", "recompute_all",
        "--time-limit", "10",
    ])
    out = capsys.readouterr().out
    assert rc == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "infeasible" in lines["checkpoint_all"]  # 60% is below the no-remat peak
    assert "x" in lines["chain_dp"] and "infeasible" not in lines["chain_dp"]
    assert png.exists()
