"""Launch backends, the worker's side (docs/design/backends.md): a worker started by a
scheduler for one run, which serves that run and exits."""
