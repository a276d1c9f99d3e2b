"""aap-server: AI agents behind the Agent Application Protocol, every step guarded (AOS)."""

from importlib.metadata import PackageNotFoundError, version


def package_version() -> str:
    """The installed distribution's version (the CLI's `--version`, `/meta`, the AOS ping)."""
    try:
        return version("aap-server")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"
