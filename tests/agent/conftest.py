"""The real control-plane service the agent tests talk to: the service tests' session fixtures
(tests/service/conftest.py), shared."""

from tests.service.conftest import clean_service, profile_path, service  # noqa: F401  (shared session fixtures)
