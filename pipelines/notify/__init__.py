"""Notifications: new alerts delivered to where analysts work (webhooks), at least once."""
