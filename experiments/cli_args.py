"""The ``remat`` command line's arguments, checked before any work: argparse types for budgets,
counts and stage choices, and :func:`validate` for what argparse cannot see (zoo models, policy
and device names, output folders). A bad argument is one line ``remat: error: ...`` and exit
status 2.
"""

from __future__ import annotations

import argparse
import os

STAGES = ("auto", "module", "layer", "eqn", "sage")


class Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line error: ``remat: error: ...`` and exit status 2."""

    def error(self, message: str):
        self.exit(2, f"remat: error: {message}\n")


def budget(text: str) -> str:
    """A budget argument (``"50%"``, ``"0.6x"``, ``"512MiB"``, bytes), checked before any work."""
    from remat.core.budget import parse_budget
    from remat.core.errors import BudgetFormatError

    try:
        parse_budget(text)
    except BudgetFormatError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _number(kind, *, minimum: float, strict: bool):
    """An argparse type: ``kind(text)`` that is > ``minimum`` (``strict``) or >= it."""
    def parse(text: str):
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {kind.__name__}") from None
        if not (x > minimum if strict else x >= minimum) or x != x:
            raise argparse.ArgumentTypeError(
                f"{text!r} must be {'>' if strict else '>='} {minimum:g}")
        return x

    parse.__name__ = kind.__name__
    return parse


positive_int = _number(int, minimum=0, strict=True)
positive_float = _number(float, minimum=0.0, strict=True)
nonnegative_float = _number(float, minimum=0.0, strict=False)


def stages(text: str) -> str | int:
    if text in STAGES:
        return text
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use {', '.join(STAGES)} or a positive int") from None


def _check_model(name: str) -> None:
    import remat
    from remat.core.errors import UnknownNameError

    if name.endswith(".json"):
        if not os.path.isfile(name):
            raise UnknownNameError("graph file", name, ["an existing node-link JSON file"])
        return
    if name.lower().replace("-", "_") not in remat.zoo.available():
        raise UnknownNameError("zoo model", name, remat.zoo.available())


def _check_writable(path: str, what: str) -> None:
    from remat.core.errors import RematError

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise RematError(f"{what} {path!r}: folder {folder!r} does not exist or is not writable")


def validate(args) -> None:
    """Check every argument that argparse's types cannot (models, policy and device names,
    output folders) before any extraction or planning; raise a ``RematError`` on the first bad
    one."""
    import policies
    import remat
    from remat.core.errors import RematError

    for m in ([args.model] if getattr(args, "model", None) else []) + list(getattr(args, "models", None) or []):
        _check_model(m)
    names = getattr(args, "policies", None)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    for n in [*(names or []), *([args.policy] if getattr(args, "policy", None) else [])]:
        policies.option_names(n)  # an unknown name raises, listing what exists
    for d in [*([args.device] if getattr(args, "device", None) else []),
              *(getattr(args, "devices", None) or [])]:
        remat.devices.get(d)
    if args.cmd == "compare":
        _check_writable(args.plot, "--plot")
    if args.cmd == "inspect" and args.timeline:
        _check_writable(args.timeline, "--timeline")
    if args.cmd == "sweep":
        if not args.out.endswith((".csv", ".parquet")):
            raise RematError(f"--out {args.out!r}: use a .csv or .parquet path")
        _check_writable(args.out, "--out")
