"""The HTML report of a build (``weightprep inspect DIR --html report.html``): statistics streamed from the
shards (:mod:`.stats`), inline SVG histograms (:mod:`.svg`), each token's text (:mod:`.tokens`) and the page
(:mod:`.page`)."""

from weightprep.report.page import render_report, write_report

__all__ = ["render_report", "write_report"]
