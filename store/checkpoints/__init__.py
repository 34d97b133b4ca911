"""Folder stores of checkpoints and exports: the store's policy (listing, latest and best,
retention), the storage it runs on, manifests, protection and the Hugging Face export layout
(docs/design/checkpoints.md, "Checkpoint store")."""
