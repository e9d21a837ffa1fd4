"""Running a program under allocscope: the user's command as a child
process (child.py), `allocscope fit` as a Python call (fit.py: fit, one
recorded run per virtual card; search.py: the largest value of a parameter
that fits), and GPU-memory budgets in tests (pytest_plugin.py, budget.py)."""

__all__: list[str] = []
