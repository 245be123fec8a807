"""The gateway: a reverse proxy in front of vLLM that records each completion it passes.

`plan` decides what the gateway adds to a request, `answer` takes it out of the answer again and
reads the request's facts (JSON or a server-sent event stream), `proxy` is the aiohttp server.
"""
