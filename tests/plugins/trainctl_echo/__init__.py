"""A run kind that only this test plug-in defines: `echo` repeats a message for some steps.

`kind.py` is the record the service and the worker read (store side: no torch), and
`executor.py` is what a worker runs it with. They are declared under the `trainctl.run_kinds`
and `trainctl.executors` entry-point groups, as any plug-in kind is.
"""
