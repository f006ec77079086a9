"""RMM's log-level functions over the ``memres`` logger."""

import logging

import pytest

import memres
from memres import level_enum, mr


@pytest.fixture(autouse=True)
def restore_the_logger():
    logger = logging.getLogger("memres")
    level, flush = logger.level, memres.get_flush_level()
    yield
    logger.setLevel(level)
    memres.set_flush_level(flush)


@pytest.mark.parametrize("level", list(level_enum))
def test_every_level_is_set_and_read_back_as_rmms(level):
    memres.set_logging_level(level)
    assert memres.get_logging_level() == level
    assert memres.should_log(level)  # as spdlog: a level at or above the set one
    below = [lvl for lvl in level_enum if lvl < level]
    assert not any(memres.should_log(lvl) for lvl in below)
    memres.set_flush_level(level)
    assert memres.get_flush_level() == level
    assert memres.logger.get_logging_level is memres.get_logging_level  # RMM's rmm.pylibrmm.logger


@pytest.mark.parametrize("python_level, expected", [(1, level_enum.trace), (15, level_enum.info),
                                                     (logging.WARNING, level_enum.warn),
                                                     (55, level_enum.off), (100, level_enum.off),
                                                     (logging.CRITICAL + 20, level_enum.n_levels)])
def test_a_python_level_between_rmms_reads_as_the_lowest_level_logged(python_level, expected):
    # `logging` takes any number: at 15 debug records are not logged, info
    # ones are; at 55 not even critical ones.
    logging.getLogger("memres").setLevel(python_level)
    level = memres.get_logging_level()
    assert level == expected
    assert memres.should_log(level) or level == level_enum.off
    assert not any(memres.should_log(lvl) for lvl in level_enum if lvl < level)


@pytest.mark.parametrize("bad", ["INFO", 3, "invalid", 100, None, 1.2345, [1, 2, 3]])
def test_what_is_no_level_is_a_type_error_as_rmms(bad):
    before = (memres.get_logging_level(), memres.get_flush_level())
    # memres.logger.log, memres's own, too: it raised KeyError (a name) or
    # logged (an int that is a level's number).
    for call in (memres.set_logging_level, memres.set_flush_level, memres.should_log,
                 lambda lvl: memres.logger.log(lvl, "a record")):
        with pytest.raises(TypeError, match="level_enum"):
            call(bad)
    assert (memres.get_logging_level(), memres.get_flush_level()) == before


def test_the_debug_level_lets_the_outstanding_allocations_through(caplog):
    t = mr.TrackingResourceAdaptor(mr.HostMemoryResource())
    p = t.allocate(100)
    caplog.set_level(logging.DEBUG)  # the handler takes everything; the logger decides
    memres.set_logging_level(level_enum.info)
    t.log_outstanding_allocations()
    assert "Outstanding allocations" not in caplog.text
    memres.set_logging_level(level_enum.debug)
    t.log_outstanding_allocations()
    assert "1 outstanding allocation(s), 100 bytes" in caplog.text
    t.deallocate(p, 100)


def test_records_at_the_flush_level_flush_the_handlers():
    class Counting(logging.Handler):
        flushes = 0

        def emit(self, record):
            pass

        def flush(self):
            self.flushes += 1

    handler = Counting()
    logger = logging.getLogger("memres")
    logger.addHandler(handler)
    try:
        t = mr.TrackingResourceAdaptor(mr.HostMemoryResource())
        memres.set_logging_level(level_enum.debug)
        memres.set_flush_level(level_enum.error)
        t.log_outstanding_allocations()  # a debug record: no flush
        assert handler.flushes == 0
        memres.set_flush_level(level_enum.debug)
        t.log_outstanding_allocations()
        assert handler.flushes == 1
        memres.flush_logger()
        assert handler.flushes == 2
    finally:
        logger.removeHandler(handler)
