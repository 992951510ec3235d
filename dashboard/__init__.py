"""The ioaware dashboard: a Streamlit + Plotly app over the `sim` cost model and measured results.

Run it with ``streamlit run dashboard/app.py``. Layout lives in ``dashboard/app.py``,
``dashboard/ui.py`` and ``dashboard/views/``; everything computed lives in ``dashboard/data.py``
(the only module that calls the cost model), ``dashboard/walk.py`` (the step-through: the event
trace grouped into steps, one row's online softmax) and ``dashboard/fmt.py`` (numbers with
units), so that it can be tested and benchmarked on its own. ``python -m dashboard.bench``
measures its latency, ``python -m dashboard.screenshots`` takes a screenshot of every page
(``dashboard/browser.py`` drives headless Chromium for both).
"""
