"""Op families. Importing this package registers every op (kernel, signatures, backward)."""
from . import redistribute  # noqa: F401
from . import elementwise  # noqa: F401
from . import reduction  # noqa: F401
from . import linalg  # noqa: F401
from . import shape  # noqa: F401
from . import indexing  # noqa: F401
from . import nn_ops  # noqa: F401
