"""What tests and benchmarks share: real servers on free ports, the tiny model, crash cases, data paths.

Not part of the product: nothing in app/, index/, encoder_runtime/ or encoder_training/ imports it.
"""
