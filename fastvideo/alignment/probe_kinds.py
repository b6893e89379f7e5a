"""The module kinds whose outputs --probe_layers records (fastvideo/alignment/probes.py). A leaf
module, so that the flag's settings can check names without importing the probes."""

PROBE_KINDS = ("rope", "norm", "attention", "block", "vae")
