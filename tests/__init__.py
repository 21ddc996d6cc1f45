"""A package, with unit/ and integration/ beneath it, so that the test files of the same name in both import as
tests.unit.test_x and tests.integration.test_x."""
