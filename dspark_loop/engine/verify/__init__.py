"""Adaptive verification: the seam (policy.py), the rule (adaptive.py) over the cost table
(cost_table.py), Algorithm 1 (budget.py), acceptance (calibration.py), what a step tells the
policy (feedback.py, windows.py) and the tunables (tunables.py)."""
