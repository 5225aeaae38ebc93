"""Build, qualify, sign and deploy CUDA 13 container images for NVIDIA Blackwell.

Importing the package does no work and imports nothing beyond the standard
library: the probe part of it runs inside images with their own python3.
"""

__version__ = "0.1.0"
