"""Every failure imgpack raises on purpose, one class per kind.

Callers catch ``ImgpackError`` for "anything imgpack refused"; problems with a
file someone handed us also subclass ``ValueError`` so that generic code that
already catches bad input keeps working.
"""

from __future__ import annotations

__all__ = [
    "ImgpackError",
    "FormatError",
    "UnsupportedVersionError",
    "MissingFieldError",
    "InconsistentPackError",
    "UnsafePathError",
    "ChecksumError",
    "PackError",
    "SourceError",
    "OutputExistsError",
    "InsufficientSpaceError",
    "ImageReadError",
    "ResumeError",
    "OutputPathError",
    "WorkerError",
    "MissingExtraError",
    "LoaderError",
    "LoaderConfigError",
    "LoaderStateError",
    "InvalidArgumentError",
    "ProofError",
    "ManifestError",
    "ShardMismatchError",
    "BenchError",
    "PackChangedError",
    "UnsupportedFieldError",
    "TargetError",
    "ClassListError",
    "ClassMismatchError",
    "LabelFileError",
    "NothingPackedError",
]


class ImgpackError(Exception):
    """Base of every error imgpack raises deliberately."""


# --- a pack on disk is wrong -------------------------------------------------


class FormatError(ImgpackError, ValueError):
    """A pack (.bin or .json) is malformed; the message names the file and the field."""


class UnsupportedVersionError(FormatError):
    """The pack was written in a format version this imgpack cannot read."""


class MissingFieldError(FormatError):
    """The index lacks a required field, or a field has the wrong type."""


class InconsistentPackError(FormatError):
    """Two facts about the pack contradict each other (sizes, counts, header vs index)."""


class UnsafePathError(FormatError):
    """The index points at a data file outside its own folder."""


class ChecksumError(FormatError):
    """Records no longer match the checksums written when they were packed (bit rot)."""


# --- packing failed ------------------------------------------------------------


class PackError(ImgpackError):
    """Packing could not be done; nothing was written under the final names."""


class SourceError(PackError, ValueError):
    """The source folder is missing, empty, or not laid out as SRC/<class>/<files>."""


class OutputExistsError(PackError):
    """The output exists and neither --force nor --resume was given."""


class InsufficientSpaceError(PackError):
    """The output filesystem cannot hold the finished pack."""


class ImageReadError(PackError):
    """One source image could not be decoded (raised only with --on-error fail)."""


class ResumeError(PackError):
    """An interrupted pack cannot be resumed with the settings given."""


class OutputPathError(PackError):
    """The output path cannot hold a pack: missing folder, or not a NAME.bin file name."""


class WorkerError(PackError):
    """A decode worker died, hung or failed unexpectedly; the message names its files."""


# --- tools ---------------------------------------------------------------------


class MissingExtraError(ImgpackError):
    """A tool needs an optional package (matplotlib, psutil) that is not installed."""


# --- loading batches -------------------------------------------------------------


class LoaderError(ImgpackError):
    """A loader could not deliver a batch (its background thread died or timed out)."""


class LoaderConfigError(LoaderError, ValueError):
    """Loader or epoch-order arguments that cannot work together."""


class LoaderStateError(LoaderError, ValueError):
    """A saved loader state does not belong to this loader (other size, batch size or ranks)."""


# --- a caller passed something unusable ------------------------------------------


class InvalidArgumentError(ImgpackError, ValueError):
    """A reader call got an argument it cannot use (unknown advice, bad buffer shape or crop)."""


class ProofError(ImgpackError):
    """The GPU proof cannot run as asked (no CUDA device, an output path that is a file)."""


# --- many packs read as one dataset ------------------------------------------------


class ManifestError(FormatError):
    """A manifest is malformed, or a shard no longer matches what the manifest recorded."""


class ShardMismatchError(FormatError):
    """Packs that cannot form one dataset: other shape, classes or settings, twice, or missing."""


# --- benchmarks ------------------------------------------------------------------


class BenchError(ImgpackError):
    """A benchmark cannot run as asked (a work folder it did not make, bad sizes or counts)."""


# --- format version 2 ------------------------------------------------------------


class PackChangedError(InconsistentPackError):
    """The pack on disk is not the one that was opened: rewritten or replaced since."""


class UnsupportedFieldError(FormatError):
    """The index marks a record field required that this imgpack does not know."""


class TargetError(PackError, ValueError):
    """Per-record target vectors that cannot be packed (missing, ragged, not numbers)."""


# --- class lists and label files (--classes-from, --labels FILE) -------------------


class ClassListError(ImgpackError, ValueError):
    """A class list (--classes-from) cannot be read: missing, empty, or a name twice."""


class ClassMismatchError(ImgpackError, ValueError):
    """Two packs that must share their class list do not; the message shows the first difference."""


class LabelFileError(PackError, ValueError):
    """A labels file (--labels FILE.csv/.jsonl) is malformed; the message names the row."""


class NothingPackedError(ImageReadError, ValueError):
    """Every source file was skipped: an empty pack would only hide that, so none is made."""
