"""The ``postlane`` command: a thin shell over the store and the worker."""
