"""The errors imgpack raises on purpose, grouped by what the user does about them.

Catch ``ImgpackError`` for "anything imgpack refused". Problems with a file or a value
someone handed us also subclass ``ValueError``, so generic code that already catches bad
input keeps working. Within a group the message tells the failures apart: it names what
was read, what was expected and what was found, in one line. A class of its own exists
only where a caller catches it on purpose and does something different.
"""


class ImgpackError(Exception):
    """Base of every error imgpack raises deliberately; the message says what to fix."""


# --- a file on disk cannot be trusted ------------------------------------------------


class FormatError(ImgpackError, ValueError):
    """A pack, index, manifest or set of shards cannot be trusted: malformed, truncated,
    from a format version this imgpack cannot read, pointing outside its folder, or shards
    that cannot form one dataset. Repack, copy it again or merge again (or upgrade imgpack
    when the message names a newer version); the message names the file and the field."""


class PackChangedError(FormatError):
    """The pack on disk is not the one that was opened: rewritten or replaced since.

    Caught on purpose by whoever republishes packs under the same name: open the dataset
    again to read the new pack; any other damage stays a plain ``FormatError``."""


class ClassMismatchError(ImgpackError, ValueError):
    """Two packs that must number their classes alike do not; the message shows the first
    difference. Caught on purpose by code that compares packs (``classes_from=``) and then
    remaps labels or repacks with ``--classes-from`` instead of evaluating shifted labels."""


# --- the call itself is wrong ----------------------------------------------------------


class InvalidArgumentError(ImgpackError, ValueError):
    """An argument that cannot be used: loader or order options that cannot work together,
    a loader state saved by another loader, a class list (``classes_from=``,
    ``--classes-from``) that cannot be read, a bad buffer shape, crop or ``watch`` setting.
    Fix the call; the message names the argument and what it should be."""


# --- reading batches -------------------------------------------------------------------


class LoaderError(ImgpackError):
    """A loader could not deliver a batch: its thread died (the cause is chained), no batch
    came within its timeout, or it was closed. Start a new pass, or look at the cause."""


# --- packing ---------------------------------------------------------------------------


class PackError(ImgpackError):
    """Packing could not be done and nothing was published under the final names: the disk
    is full, the output path cannot hold a pack, a decode worker died or hung, another run
    writes the same output, or an interrupted run cannot be resumed as asked. The message
    says what to do; rerunning the same command continues an interrupted run."""


class SourceError(PackError, ValueError):
    """The packer's input is wrong: the source folder (missing, empty, not SRC/<class>/),
    a source image that cannot be decoded (``--on-error fail``, or every file skipped), a
    labels file or target vectors. Fix the input, or skip bad images with --on-error skip."""


class OutputExistsError(PackError):
    """The output (or an interrupted run of it) is already there and may not be replaced:
    a pack from another source or settings, or any file where neither force nor resume
    allows it. Caught on purpose by pipelines that rerun a packing step: keep what is
    there, or pack again with ``force=True`` (``--force``)."""


# --- an optional package ------------------------------------------------------------------


class MissingExtraError(ImgpackError):
    """A tool needs an optional package that is not installed (plotting: matplotlib);
    install the extra the message names, e.g. ``pip install imgpack[plot]``."""


# every class above, in the order they are defined: the module is its error classes
__all__ = [name for name, value in dict(globals()).items() if isinstance(value, type)]
