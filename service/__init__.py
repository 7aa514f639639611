"""The reference inference service: a FastAPI model server with named fault scenarios.

``stagescope serve`` runs it (:mod:`stagescope.service.cli`); :func:`stagescope.service.app.create_app`
builds the app; :mod:`stagescope.service.scenarios` holds each scenario's settings and ground truth.
The accelerator of the default backend is SIMULATED (see :mod:`stagescope.service.backends`).
"""
