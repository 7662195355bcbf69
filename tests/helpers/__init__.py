"""Helpers shared by the test modules: model builders, toy graphs and problems, independent
oracles, shared checks and the solver time limits.

A ``tests/test_*.py`` module is imported by pytest only; what two test modules share lives here
(or, for fixtures, in ``tests/conftest.py``), imported as ``from helpers.<module> import ...``
(pytest puts ``tests/`` on ``sys.path``; ``tests/test_test_layout.py`` checks the rule).
"""
