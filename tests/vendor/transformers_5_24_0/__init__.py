"""transformers 5.24.0's `tests/test_modeling_common.py` and `tests/test_configuration_common.py`
(Apache License 2.0, LICENSE), with stubs for the three modules of transformers' test tree they
import that its source distribution does not ship: tests/test_transformers_common.py loads this
folder as a package when transformers 5.24.0 is installed, offline."""
