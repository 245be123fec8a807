"""Ingest of request records over HTTP: REST bulk ingest (rest.py) and OTLP traces (otlp.py).

Both take an ingest token, a bounded body and a slot of their process, and store through one call,
all in admission.py; each endpoint only reads its own wire format and writes its own answers.
"""
