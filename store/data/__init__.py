"""Training data without torch: corpora, tokenizers, text codecs, prepared datasets, token
shards and the data roots that confine them (docs/design/data.md, "Datasets")."""
