"""Self-contained HTML reports with interactive Plotly charts: one run, a sweep, the validation.

One module per kind of report (:mod:`.run`, :mod:`.sweep`, :mod:`.validation`) and the shared
page writer (:mod:`.page`). plotly is optional (``pip install 'memwall[html]'``); it is imported
only when a page is written, and :func:`check_html_path` says so in one line before any work.
"""

from simulator.report.html.page import HTML_SUFFIXES, INSTALL_HINT, check_html_path, require_plotly

__all__ = ["HTML_SUFFIXES", "INSTALL_HINT", "check_html_path", "require_plotly"]
