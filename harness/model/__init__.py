"""Building and walking a model as the trainer does, through the backend entry
(``build``, ``unit_walk``).
"""
