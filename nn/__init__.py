"""ctensor.nn: modules and functional ops built on the public ctensor API."""
from . import functional  # noqa: F401
