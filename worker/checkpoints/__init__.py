"""Checkpoints, torch half: saving and loading training state, asynchronously and sharded, and
exports; the store's layout and commit protocol are store/checkpoints/.
"""
