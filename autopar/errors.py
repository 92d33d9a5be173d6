"""Domain errors. Each message is one line that names the fix; the CLI maps them to exit code 2."""


class AutoparError(Exception):
    """Base class for every error a user can cause. str(err) is the one-line message."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UnknownModelError(AutoparError):
    """A model name that is neither a preset nor a readable file."""


class UnknownClusterError(AutoparError):
    """A cluster name that is neither a shipped profile nor a readable file."""


class InputFileError(AutoparError):
    """A missing, unreadable or malformed input file."""


class OutputFileError(AutoparError):
    """An output that cannot be written: it exists (without --force), is a directory, or the
    system refuses it (permissions, a read-only or full disk)."""


class SchemaError(AutoparError):
    """A file or option whose content breaks its schema (unknown key, bad value)."""


class UnsupportedModelError(AutoparError):
    """A Hugging Face config whose model_type autopar cannot build."""


class InvalidPlanError(AutoparError):
    """A parallel plan that breaks an invariant (degrees, divisibility, framework limits)."""


class NoFeasiblePlanError(AutoparError):
    """The search found no plan that fits in memory."""


class ExportError(AutoparError):
    """A plan that the chosen framework cannot express."""
