"""The `tori` stage: tori's passes over the torch dialect, run by MLIR's PassManager.

The registry and the textual pipelines live in `tori.passes.registry`; each pass
lives in its own module here and registers itself when imported below.
"""

from __future__ import annotations

from tori.passes.registry import (  # noqa: F401
    DEFAULT_PIPELINE,
    PassError,
    PassRun,
    PassStep,
    RegisteredPass,
    parse_pipeline,
    register_pass,
    registered_passes,
    run_pipeline,
    validate_pipeline,
)

# Each pass module registers itself on import.
from tori.passes import depthwise_nhwc  # noqa: E402,F401
from tori.passes import erf_polynomial  # noqa: E402,F401
from tori.passes import fold_constants  # noqa: E402,F401
from tori.passes import fold_empty  # noqa: E402,F401
from tori.passes import int8_weight_matmul  # noqa: E402,F401
from tori.passes import materialize_masks  # noqa: E402,F401
from tori.passes import packed_attention  # noqa: E402,F401
from tori.passes import packed_matmul  # noqa: E402,F401
from tori.passes import pooling_nhwc  # noqa: E402,F401
from tori.passes import row_reductions  # noqa: E402,F401
from tori.passes import lower_dialect  # noqa: E402,F401
from tori.passes import fuse_attention  # noqa: E402,F401
from tori.passes import fuse_layer_norm  # noqa: E402,F401
from tori.passes import specialize_guards  # noqa: E402,F401
from tori.passes import widen_16_bit  # noqa: E402,F401
