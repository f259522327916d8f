"""Fixtures of the repository's own tests (the packaging, the docs and their code blocks,
the demo, the compat runner, the architecture, the test oracle). The README's example
runs on the unit tests' app (tests/unit/conftest.py); the integration tests here start
their own workers and need none of tests/integration/conftest.py's fixtures."""

from tests.unit.conftest import _forget_revoked_ids, app

__all__ = ["_forget_revoked_ids", "app"]
