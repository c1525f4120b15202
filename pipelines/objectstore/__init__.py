"""The lake on S3 or an S3-compatible store: `path.py` (where tables and checkpoints live, and the
file operations seclake does on them), `server.py` (S3Proxy, the local S3-compatible server for
development and tests; `seclake s3`). docs/deploy.md."""
