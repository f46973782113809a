"""Workarounds for executorch 1.5.1 behaviour, one module per upstream problem.

Each module says what executorch does, what etfuse does about it, and how to tell when it can go
(its test shows the stock behaviour).
"""
