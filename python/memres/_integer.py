"""What an integer argument of the package takes: an ``int``, or an integer
of another type that says its value (NumPy's, through ``__index__``), as
RMM's C arguments take them; never a ``bool``."""

import operator


def integer(value):
    """``value`` as an ``int``; ``None`` where it is no integer."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return None
    return operator.index(value)
