"""Launch backends, the store's side (docs/design/backends.md): what a run may ask of the
scheduler that places it, and the pure rules of each backend (the command lines it builds,
the scheduler's answers it reads). The service drives a backend (`service.backends`); the
worker serves one launched run (`worker.backends`)."""
