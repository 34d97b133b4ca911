"""Run kinds, torch-free half: each kind's request, plan, resolver and registry record
(docs/design/kinds.md, "Run kinds"); its executor is worker/kinds/ of the same name.
"""
