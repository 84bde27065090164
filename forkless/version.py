from importlib.metadata import PackageNotFoundError, version as _dist_version

try:
    __version__ = _dist_version("forkless")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.1.0"
