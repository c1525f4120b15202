"""Threat intelligence: indicator feeds into `indicators`, and the sweep of history for matches."""
