"""Backend-neutral forward/backward pairs written once over an Array API namespace ``xp``.

One topic a module; each imports only :mod:`householderla._lib` and its siblings here.
"""
