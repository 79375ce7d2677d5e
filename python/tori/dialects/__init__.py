"""The `tori` MLIR dialect, defined in Python (IRDL through torch_mlir.dialects.ext)."""
