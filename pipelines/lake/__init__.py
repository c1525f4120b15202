"""The table layer: the only code that touches Delta (delta-spark for every read and write;
delta-rs only for the JVM-free listings in `log.py`)."""
