"""Unknown names anywhere give one line that lists what exists: policies (and their options),
zoo models (and their options), device profiles, ``stages=``, and the CLI (``remat: error: ...``,
exit status 2, no traceback)."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import policies
import remat
from experiments.cli import main
from remat.core.errors import ExtractionError, RematError, UnknownNameError


def one_line_listing(exc: BaseException, *names: str) -> str:
    msg = str(exc)
    assert "\n" not in msg, msg
    for n in names:
        assert n in msg, (n, msg)
    return msg


@pytest.mark.parametrize("call,kind,lists", [
    (lambda: policies.get("nosuch"), "policy", policies.available()),
    (lambda: policies.get("sqrtn", nosuch=1), "option of policy", policies.option_names("sqrtn")),
    (lambda: remat.value_and_grad(lambda x: jnp.sum(x ** 2), "nosuch"), "policy",
     policies.available()),
    (lambda: remat.zoo.get("nosuch"), "zoo model", remat.zoo.available()),
    (lambda: remat.zoo.get("mlp", batch_size=2, widht=8), "option of zoo model",
     remat.zoo.option_names("mlp")),
    (lambda: remat.devices.get("nosuch"), "device profile", remat.devices.available()),
])
def test_unknown_registry_names_list_what_exists(call, kind, lists):
    with pytest.raises(UnknownNameError) as info:
        f = call()
        f(jnp.ones(3))  # the drop-in resolves its policy when first called
    assert info.value.kind.startswith(kind)
    one_line_listing(info.value, *lists)


def test_unknown_zoo_option_is_still_a_type_error():
    with pytest.raises(TypeError):
        remat.zoo.get("mlp", batch_size=2, colour="red")


def test_unknown_stages_lists_the_modes():
    with pytest.raises(ExtractionError) as info:
        remat.extract(lambda x: jnp.sum(x ** 2), jnp.ones(3), stages="nosuch")
    assert isinstance(info.value, RematError)
    one_line_listing(info.value, "'nosuch'", "'auto'", "'module'", "'layer'", "'eqn'", "int")


@pytest.mark.parametrize("argv,lists", [
    (["plan", "nosuch_model", "--policy", "sqrtn"], remat.zoo.available()),
    (["plan", "mlp", "--batch-size", "2", "--policy", "nosuch"], policies.available()),
])
def test_cli_unknown_names_are_one_error_line(argv, lists, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("remat: error: unknown") and "Traceback" not in err, err
    one_line_listing(err, *lists)
