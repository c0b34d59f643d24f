"""Code that runs inside the launched ranks: the boot folder put first on their PYTHONPATH
(``boot/sitecustomize.py``), the one installer of the rank-side observers (``observers``) and
the observers (``step0``, ``hooks``), the start-up collection setting (``startup_gc``), and the
warm start (``warm_start``: a worker's hand-over to a zygote, and the zygote).
"""
