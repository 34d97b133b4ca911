"""Training, torch-free half: optimizer kinds, the WSD schedule's phases, parallel strategies
and the memory estimate (docs/design/training.md, "Optimizers", "Multi-GPU and multi-node"); the
loop that runs them is worker/training/.
"""
