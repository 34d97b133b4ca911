"""Metrics sinks: train runs' events mirrored to TensorBoard and MLflow, in the service
(docs/design/sinks.md, "Metrics sinks").

`base` says what a sink is and what of an event it mirrors, `tensorboard` writes event files,
`mlflow` talks to a tracking server over its REST API, and `mirror` feeds each sink from the
event log in a thread of its own, with its cursors in the database (store/db/sinks.py).
"""
