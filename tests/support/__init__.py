"""Helpers shared by the test folders that are not tests: the real stack's servers (stack), the REST API a
run is driven through (api), the fixtures of the modules that run the real stack (stack_fixtures) and the
browser tests' helpers (browser).

The rule: test modules and conftests import helpers from here (or from their own folder's helper module,
such as tests/unit/platform/helpers.py), never from another test module or a conftest;
tests/unit/test_test_layout.py checks it."""
