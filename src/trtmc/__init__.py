"""trtmc: timm image classifiers to fast, self-describing inference bundles."""

__version__ = "0.1.0"
