"""Op families. Importing this package declares every op (kernel, signatures, backward,
public function and Tensor method together, see :func:`ctensor.dispatch.defop`)."""
from . import redistribute  # noqa: F401
from . import elementwise  # noqa: F401
from . import reduction  # noqa: F401
from . import linalg  # noqa: F401
from . import shape  # noqa: F401
from . import indexing  # noqa: F401
from . import masking  # noqa: F401
from . import embedding  # noqa: F401
from . import loss  # noqa: F401
from . import softmax  # noqa: F401
from . import normalization  # noqa: F401
from . import gather  # noqa: F401
from . import selection  # noqa: F401
from . import scatter  # noqa: F401
from . import scatter_reduce  # noqa: F401
from . import advanced_indexing  # noqa: F401
from . import sorting  # noqa: F401
from . import scan  # noqa: F401
from . import rearrange  # noqa: F401
from . import comparison  # noqa: F401
from . import einsum  # noqa: F401
from . import inplace  # noqa: F401
from . import inplace_math  # noqa: F401
from . import sampling  # noqa: F401
from . import factory  # noqa: F401
from . import optimizer  # noqa: F401
