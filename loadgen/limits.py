"""Bounds of one load-generator run, checked before anything is allocated or sent.

A schedule holds 8 bytes per request and a run about 0.5 kB per result, so 10 million requests is a
few GB; one sender does about 10,000 requests/s, so a million per second is far beyond what it can
send; 10^6 s is 11.6 days. No imports: the command's options use these at registration, before any
extra (numpy, pyarrow) is needed.
"""

__all__ = ["BODYLESS_METHODS", "MAX_DURATION_S", "MAX_RATE_RPS", "MAX_REQUESTS", "MAX_TOKENS", "METHODS"]

MAX_REQUESTS = 10_000_000
MAX_RATE_RPS = 1e6
MAX_DURATION_S = 1e6
#: Largest prompt or output length of one request (the longest context windows are about 10^7 tokens).
MAX_TOKENS = 10_000_000
#: The HTTP methods ``stagescope load --method`` sends.
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")
#: Methods whose requests carry no body unless a ``--body`` template gives one (RFC 9110: a GET,
#: HEAD or DELETE body has no defined meaning).
BODYLESS_METHODS = ("GET", "HEAD", "DELETE")
