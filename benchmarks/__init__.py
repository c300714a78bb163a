"""Benchmarks of householderla (``python -m benchmarks.<script>``; benchmarks/README.md).

Importing the package quiesces idle thread pools for every script: NumPy/SciPy (OpenBLAS) and
torch (OpenMP) keep separate pools whose idle threads spin for a while after each call
(OpenBLAS ~2²⁸ cycles, libgomp's spin count), so with two or more threads the library timed
second competes with the first one's spinning threads and ratios between them swung 1.2–1.8×
from run to run. Passive waiting removes that; the variables must be set before NumPy and
torch load their pools, which is why they are set here (a caller's own values are kept).
"""

import os

QUIESCE_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}
for _k, _v in QUIESCE_ENV.items():
    os.environ.setdefault(_k, _v)
