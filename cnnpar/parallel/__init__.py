"""One-device and multi-device speed techniques, each an apply_* function, and Precision."""

from cnnpar.parallel.apply import parallelize
from cnnpar.parallel.precision import Precision, resolve_for

__all__ = ["Precision", "parallelize", "resolve_for"]
