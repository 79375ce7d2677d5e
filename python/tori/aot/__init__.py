"""Ahead-of-time export: `tori.export` traces a model's entry points with torch.export,
runs tori's pipeline, compiles one IREE module per target and writes an artifact
folder that `tori.runtime.load` runs with numpy alone (docs/export.md).
"""
