"""Pure policy: values, validation and decisions. Nothing in this package does I/O."""
