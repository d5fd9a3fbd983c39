"""Op families. Importing this package registers every op (kernel, signatures, backward)."""
from . import redistribute  # noqa: F401
