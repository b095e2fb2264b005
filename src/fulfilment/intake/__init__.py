"""The intake of the warehouse's webhooks (``fulfilment webhooks``): verify, read, apply, answer.

``signatures`` checks a request's Standard Webhooks headers and signature, ``receiver``
answers it row by row of the answer table, ``app`` is the FastAPI app and its OpenAPI
document; the root ``entrypoints.webhooks`` builds them from the settings and serves them.
"""
