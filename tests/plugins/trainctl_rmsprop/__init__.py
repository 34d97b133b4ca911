"""A plug-in optimizer kind for the tests: `rmsprop`, RMSprop over every parameter, with
hyperparameters of its own (`rmsprop_lr`, `rmsprop_alpha`) that no built-in kind has
(store/training/choice.py). Its record (`kind.py`, no torch) is declared under
`trainctl.optimizer_kinds`, its builder (`builder.py`) under `trainctl.optimizers`."""
