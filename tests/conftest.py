"""Test-wide settings: one fixed hypothesis profile so property tests are reproducible and bounded.

derandomize: the same examples every run (CI never flakes on a new random draw);
max_examples: small, so the whole suite stays well under CI's 10 minutes on 2 shared cores;
deadline None: a slow shared machine must not fail a test on timing.
"""

from hypothesis import HealthCheck, settings

settings.register_profile(
    "memwall",
    derandomize=True,
    max_examples=25,
    deadline=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("memwall")
