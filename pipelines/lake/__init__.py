"""The table layer: the only code that touches Delta (Spark writes Parquet, delta-rs commits)."""
