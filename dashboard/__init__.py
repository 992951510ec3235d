"""The ioaware dashboard: a Streamlit + Plotly app over the `sim` cost model and measured results.

Run it with ``streamlit run dashboard/app.py``. Layout lives in ``dashboard/app.py``,
``dashboard/ui.py`` and ``dashboard/views/``; everything computed (model sweeps, result tables,
the online-softmax walk-through) lives in ``dashboard/data.py`` as cached, Streamlit-free-to-call
functions, so that it can be tested and benchmarked on its own.
"""
