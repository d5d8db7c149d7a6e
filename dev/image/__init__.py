"""The product image, built without a Docker engine (``python -m dev.image build``).

Development tooling: it never enters the image. The logic is in ``dev.image.build``.
"""
