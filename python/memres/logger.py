"""memres's log: Python's ``logging`` logger ``memres``, with the level
functions of RMM's ``rmm.pylibrmm.logger`` over it (RMM's levels are those
of librmm's own log, which memres does not have: here they set the
``memres`` logger's level, so that ``set_logging_level(level_enum.debug)``
lets ``TrackingResourceAdaptor.log_outstanding_allocations()`` through, as
in RMM; a handler shows them, as ``logging`` has it: with none, Python's
last resort shows warnings and above only)."""

import enum
import logging

LOGGER = logging.getLogger("memres")


class level_enum(enum.IntEnum):  # noqa: N801 (RMM's name)
    """RMM's log levels, lowest first."""
    trace = 0
    debug = 1
    info = 2
    warn = 3
    error = 4
    critical = 5
    off = 6
    # RMM's count of the levels above; set, as RMM's, it logs nothing.
    n_levels = 7


# Each level as Python's `logging` numbers it (`trace` below DEBUG, `off`
# and `n_levels` above CRITICAL).
_PYTHON = {level_enum.trace: 5, level_enum.debug: logging.DEBUG, level_enum.info: logging.INFO,
           level_enum.warn: logging.WARNING, level_enum.error: logging.ERROR,
           level_enum.critical: logging.CRITICAL, level_enum.off: logging.CRITICAL + 10,
           level_enum.n_levels: logging.CRITICAL + 20}

# Records at or above this level are followed by a flush of the handlers.
_flush_level = level_enum.error


def _checked(level):
    """``level`` if it is a ``level_enum``; TypeError otherwise (a plain int
    or a name included), as RMM's."""
    if not isinstance(level, level_enum):
        raise TypeError(f"memres: a log level is a memres.level_enum, not {level!r}")
    return level


def _of_python(number):
    """The lowest ``level_enum`` whose records a logger at Python level
    ``number`` logs (``off`` where it logs none of them; ``n_levels`` where
    that was set)."""
    if number == _PYTHON[level_enum.n_levels]:
        return level_enum.n_levels
    return min((lvl for lvl, n in _PYTHON.items() if number <= n <= _PYTHON[level_enum.off]),
               default=level_enum.off)


def set_logging_level(level):
    """Logs records of ``level`` and above (sets the ``memres`` logger's
    level)."""
    LOGGER.setLevel(_PYTHON[_checked(level)])


def get_logging_level():
    """The level the ``memres`` logger logs from (its effective level, so
    a level set on a parent logger counts)."""
    return _of_python(LOGGER.getEffectiveLevel())


def should_log(level):
    """Whether a record of ``level`` would be logged."""
    return LOGGER.isEnabledFor(_PYTHON[_checked(level)])


def set_flush_level(level):
    """Flushes the log's handlers after each record memres logs at
    ``level`` or above (``level_enum.error`` at first)."""
    global _flush_level
    _flush_level = _checked(level)


def get_flush_level():
    return _flush_level


def flush_logger():
    """Flushes the handlers of the ``memres`` logger and of its parents."""
    logger = LOGGER
    while logger is not None:
        for handler in logger.handlers:
            handler.flush()
        logger = logger.parent if logger.propagate else None


def log(level, message, *args):
    """Logs ``message % args`` at ``level`` (a ``level_enum``; TypeError
    otherwise, as the level functions) to the ``memres`` logger, then
    flushes at or above the flush level."""
    LOGGER.log(_PYTHON[_checked(level)], message, *args)
    if level >= _flush_level and should_log(level):
        flush_logger()
