"""Operator commands over a whole home: `seclake rollback`, `maintain` and `retention` (docs/operations.md)."""
