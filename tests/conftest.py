"""Settings for the whole test suite.

Property-based tests draw the same examples on every run (``derandomize``): a failure in CI is
one that reproduces, and a run that passes says the same thing each time.
"""

from hypothesis import settings

settings.register_profile("reproducible", derandomize=True)
settings.load_profile("reproducible")
