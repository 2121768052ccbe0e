"""core: what every other room stands on — errors, the schema, file-system helpers, failpoints.

Modules: ``errors`` (the typed error hierarchy), ``schema`` (Field, Schema, validation of
values against fields), ``fs`` (atomic writes, fsync of files and directories, fallocate,
mmap helpers), ``failpoint`` (named crash points for the kill -9 tests), ``episodes``
(episode bounds of a lane's rows, pure numpy), ``batch`` (``TransitionBatch``, the batch type every
reader of a store returns), ``version`` (the package version).

Invariant: core imports nothing else of mmreplay, and nothing heavier than numpy.
"""
