"""What XLA holds live at its temp peak, read from a dump (to check :mod:`remat.xla_memory`).

``XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_pass_re=NONE"`` makes XLA write, per compiled
module, the optimised HLO (``PREFIX.txt``, the entry computation in schedule order), the buffer
assignment (``PREFIX-buffer-assignment.txt``: the temp allocation's values, sizes and offsets)
and its values (each value's positions and uses: ``PREFIX-buffer-assignment-values.txt``, or
the assignment's "Used values" section before jaxlib 0.12), with
``PREFIX`` = ``DIR/module_NNNN.jit_NAME.cpu_after_optimizations``.  A temp value lives from the
first to the last entry instruction that defines, aliases or uses it; the peak of the summed
sizes is XLA's live peak (an upper bound where an output is written in place into an operand,
both counted), against the allocation's size (the temp, heap packing included).  Which
buffers are live there says where a predicted temp falls short.

Command::

    python experiments/xla_live_buffers.py DIR/module_0048.jit_loss.cpu_after_optimizations [N]

prints the temp, the live peak, the entry instruction at the peak and the ``N`` (25) largest
buffers live there (bytes, name, first and last instruction index); it writes no result file.
"""

from __future__ import annotations

import dataclasses
import re
import sys

_INSTR = re.compile(r"\s+(?:ROOT )?%?([\w.\-]+) = ")
_TEMP = re.compile(r"allocation \d+: size (\d+), [^\n]*preallocated-temp:\n((?: value:[^\n]*\n)+)")
_VALUE = re.compile(r"<(\d+) ([^ ]+) @0> \(size=(\d+),offset=\d+\)")
_USES = re.compile(r"<(\d+) [^ ]+ @0>\n positions:\n((?:  [^\n]*\n)*) uses:\n((?:  [^\n]*\n)*)")


@dataclasses.dataclass(frozen=True)
class LivePeak:
    """``temp``: the temp allocation's bytes; ``peak``: the live peak, bytes, at entry
    instruction ``at`` (``name``); ``live``: ``(bytes, value name, first, last)`` of the values
    live there, largest first."""

    temp: int
    peak: int
    at: int
    name: str
    live: tuple


def live_peak(prefix: str) -> LivePeak:
    """The live peak of the temp allocation of the dumped module ``prefix`` (module docstring)."""
    with open(prefix + ".txt") as f:
        hlo = f.read()
    entry = hlo[hlo.index("\nENTRY"):].splitlines()[1:]
    order: dict[str, int] = {}
    for line in entry:
        m = _INSTR.match(line)
        if m:
            order[m.group(1)] = len(order)
    with open(prefix + "-buffer-assignment.txt") as f:
        assignment = f.read()
    block = _TEMP.search(assignment)
    if block is None:
        raise ValueError(f"{prefix}: no preallocated-temp allocation")
    sizes = {int(m.group(1)): (m.group(2), int(m.group(3)))
             for m in _VALUE.finditer(block.group(2))}
    try:  # a file of its own from jaxlib 0.12; before, the assignment's "Used values" section
        with open(prefix + "-buffer-assignment-values.txt") as f:
            values = f.read()
    except FileNotFoundError:
        values = assignment
    spans = {}
    for m in _USES.finditer(values):
        v = int(m.group(1))
        if v not in sizes:
            continue
        names = [x.strip().split("{")[0] for x in m.group(2).splitlines()]
        names += [x.strip().split(",")[0] for x in m.group(3).splitlines() if "(none)" not in x]
        ts = [order[n] for n in names if n in order]
        if ts:
            spans[v] = (min(ts), max(ts))
    live = [0] * (len(order) + 1)
    for v, (a, b) in spans.items():
        for t in range(a, b + 1):
            live[t] += sizes[v][1]
    peak = max(live)
    at = live.index(peak)
    names = {t: n for n, t in order.items()}
    there = sorted(((sizes[v][1], sizes[v][0], a, b) for v, (a, b) in spans.items()
                    if a <= at <= b), reverse=True)
    return LivePeak(int(block.group(1)), peak, at, names.get(at, ""), tuple(there))


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    r = live_peak(argv[0])
    n = int(argv[1]) if len(argv) > 1 else 25
    print(f"temp {r.temp} B, live peak {r.peak} B at instruction {r.at} ({r.name})")
    for row in r.live[:n]:
        print(*row)


if __name__ == "__main__":
    main()
