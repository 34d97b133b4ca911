"""A parallel strategy that exists only as a plug-in, for tests/e2e/test_strategy_plugin.py:
`replicas`, ddp's replicas under a name of its own, whose checkpoints are sharded (every rank
writes its part, the layout the built-in ddp does not write). Its record (`record.py`, torch-free,
what the service reads) and its builder (`builder.py`, the worker's) are declared under the
`trainctl.parallel_strategies` and `trainctl.strategies` entry-point groups, as any plug-in
strategy is.
"""
