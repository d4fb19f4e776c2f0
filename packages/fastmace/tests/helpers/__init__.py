"""What several test modules share, imported as ``helpers.<module>`` (the tests directory is on
sys.path under pytest): structures, models, potentials and checks that are not fixtures.
Fixtures live in conftest.py."""
