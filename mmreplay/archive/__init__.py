"""archive: compressed zarr v3 archives of a store (local path or any fsspec URL), and shipping.

Modules: ``zarr_io`` (export_archive, import_archive, open_archive, verify_archive), ``layout`` (the
archive's group layout, checksums, metadata and chunk manifest), ``remote`` (an object store's errors,
said naming the archive; ``object_store_error``: an S3 client's error as one line and what to check,
for a tool that reports errors, as the command line does), ``shipping`` (the learner's exactly-once ingestion of
archives that remote actors export). A field's statistics over an archive: ``mmreplay.stats``.

Invariants: an archive holds sealed segments only, one chunk row range per segment, each
chunk checksummed; ingestion never duplicates a row, even when killed midway.
"""

from ..core.errors import ArchiveError, CorruptArchiveError
from .remote import object_store_error
from .zarr_io import (ArchiveCheck, ArchiveReport, ImportReport, export_archive, import_archive, open_archive,
                      verify_archive)

__all__ = ["ArchiveCheck", "ArchiveError", "ArchiveReport", "CorruptArchiveError", "ImportReport", "export_archive",
           "import_archive", "object_store_error", "open_archive", "verify_archive"]
