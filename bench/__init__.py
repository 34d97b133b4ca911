"""Side-by-side performance measurements of trainctl and its peers: `python -m bench`.

Each module measures one thing and returns a list of `Figure`s; `bench.__main__` runs them
and prints the figures and the ratios against their targets. Nothing here is imported by
service/, store/ or worker/: the HF peer (transformers) is a `bench` extra only.
"""
