"""Webhooks: run state changes POSTed to registered URLs, signed, retried, logged
(docs/design/webhooks.md, "Webhooks").

`targets` says which URLs and hosts a webhook may name, `signing` how a delivery is signed
and checked (receivers may import it: it needs the standard library only), `sending` makes
one attempt, and `dispatcher` feeds deliveries from the event log in a thread of its own.
"""
