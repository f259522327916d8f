"""``project/`` is a user's Django project with its own test suite, run by
tests/integration/test_users_test_suites.py in a pytest of its own (from a copy, with
its own ``pytest.ini`` and ``conftest.py``): this suite never collects it."""

collect_ignore = ["project"]
