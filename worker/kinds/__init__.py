"""Run kinds, torch half: each kind's executor (docs/design/kinds.md, "Run kinds"); its request,
plan and record are store/kinds/ of the same name.
"""
