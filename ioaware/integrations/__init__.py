"""Adapters that put :func:`ioaware.scaled_dot_product_attention` into other libraries' models.

* :mod:`ioaware.integrations.transformers` — ``register()`` makes ``attn_implementation="ioaware"``
  work in Hugging Face ``transformers`` models.
"""
