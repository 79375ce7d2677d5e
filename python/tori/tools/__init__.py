"""Tools for looking at the pipeline: stage dumps, `inspect`, pass-pipeline
experiments and the HTML compile report; the `tori` command (tori.cli) drives them.
"""
