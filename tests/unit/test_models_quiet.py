"""The trainer's and searcher's entry points turn transformers' progress bars off: a weight
version saved or loaded through transformers would print one into the service's log."""

from transformers.utils import logging as transformers_logging

from tba.models.loading import quiet_progress_bars


def test_quiet_progress_bars_turns_transformers_bars_off():
    transformers_logging.enable_progress_bar()
    try:
        quiet_progress_bars()
        assert not transformers_logging.is_progress_bar_enabled()
    finally:
        transformers_logging.enable_progress_bar()
