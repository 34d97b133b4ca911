"""Training, torch half: the loop, optimizers, sharded Muon, the schedule, parallel strategies
and FSDP, validation, memory admission at claim; their torch-free records are store/training/.
"""
