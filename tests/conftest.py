"""Settings every test shares.

Hypothesis' per-example deadline is a timing assertion: on a shared 2-core CI machine one slow
example fails a property that holds. Speed lives in the benchmarks, so the deadline is off.
"""

from hypothesis import settings

settings.register_profile("gpupool", deadline=None)
settings.load_profile("gpupool")
