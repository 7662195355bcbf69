"""The numpy core: the training graph, plans, the event program, memory layout, budgets, typed
errors, device profiles and the simulator. It imports no JAX, and nothing above it
(``solvers``, ``policies``, the JAX side of ``remat``); everything else imports it.
"""
