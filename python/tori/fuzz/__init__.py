"""Differential fuzzing of tori against eager PyTorch: hypothesis generates small
random programs (program.py, ops.py, strategies.py), check.py compares them.
"""
