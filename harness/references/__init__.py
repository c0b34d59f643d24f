"""Independent references, one per piece of math or contract: the float64 model pieces
(``model``), torchtitan's loss contract (``loss``), the pretraining and SFT data paths
(``data``, ``sft_data``). Built from the per-op references in harness/kernels/ops.
"""
