"""tori's decompositions by op family, one module each; importing this package
registers them all in `tori.frontend.decompositions`' table.

Preference, per op: PyTorch's own decomposition (chosen per op, `pytorch.py`), then
tori's formulas in torch ops (the other modules). Each entry is checked by the OpInfo
conformance suite (`python -m tori.conformance`).
"""

from tori.frontend.decomp import pytorch  # noqa: F401  (registers on import)
from tori.frontend.decomp import special  # noqa: F401
from tori.frontend.decomp import polynomials  # noqa: F401
from tori.frontend.decomp import linalg  # noqa: F401
from tori.frontend.decomp import selection  # noqa: F401
from tori.frontend.decomp import extrema  # noqa: F401
from tori.frontend.decomp import signs  # noqa: F401
from tori.frontend.decomp import view_scatter  # noqa: F401
from tori.frontend.decomp import factories  # noqa: F401
from tori.frontend.decomp import logarithms  # noqa: F401
from tori.frontend.decomp import floating  # noqa: F401
from tori.frontend.decomp import comparisons  # noqa: F401
from tori.frontend.decomp import gamma  # noqa: F401
from tori.frontend.decomp import error_functions  # noqa: F401
from tori.frontend.decomp import nonzero  # noqa: F401
from tori.frontend.decomp import embedding_bag  # noqa: F401
from tori.frontend.decomp import distances  # noqa: F401
from tori.frontend.decomp import pooling  # noqa: F401
from tori.frontend.decomp import products  # noqa: F401
from tori.frontend.decomp import indexing  # noqa: F401
from tori.frontend.decomp import bessel  # noqa: F401
from tori.frontend.decomp import take  # noqa: F401
from tori.frontend.decomp import avg_pool  # noqa: F401
from tori.frontend.decomp import conv_backward  # noqa: F401
from tori.frontend.decomp import dynamic_views  # noqa: F401
from tori.frontend.decomp import division  # noqa: F401
from tori.frontend.decomp import sampling  # noqa: F401
from tori.frontend.decomp import resampling  # noqa: F401
from tori.frontend.decomp import normal  # noqa: F401
from tori.frontend.decomp import trig  # noqa: F401
from tori.frontend.decomp import distributions  # noqa: F401
from tori.frontend.decomp import powers  # noqa: F401
from tori.frontend.decomp import moments  # noqa: F401
from tori.frontend.decomp import logical_reductions  # noqa: F401
from tori.frontend.decomp import histogram  # noqa: F401
from tori.frontend.decomp import qr  # noqa: F401
from tori.frontend.decomp import spectral  # noqa: F401
from tori.frontend.decomp import grouped_conv  # noqa: F401
from tori.frontend.decomp import batch_norm  # noqa: F401
from tori.frontend.decomp import softmax  # noqa: F401
from tori.frontend.decomp import attention  # noqa: F401
