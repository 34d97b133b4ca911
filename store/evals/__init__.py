"""Downstream evaluations, torch-free half: the task catalog and the evaluations a train run
queues (docs/evals.md); the scoring is worker/evals/.
"""
