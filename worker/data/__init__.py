"""Training data, torch half: the loader, prepared datasets, mixtures and prepare runs; their
layout and formats are store/data/.
"""
